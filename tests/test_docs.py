"""The reference in docs/ against the code: what the loader, the daemon and the metrics take or
write is documented, and nothing documented is gone.

Convention (docs/command-files.md "How to read the tables"): a key, a metric or a
config section is documented by a row of a Markdown table whose first column is
headed `key` (or `metric`), its name in backticks in the first cell; `*` stands
for a name the operator chooses. The lists are derived from the code (the
pydantic models, params.PARAM_KEYWORDS, the finite lists of errors.py, the
metrics registry), so a key added to a model fails here until it is documented.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import jsonschema
import orjson
from daemon_harness import JOB_COMMAND, JOB_OUT, ROOT, Running, shipped_commands, with_daemon
from pydantic import BaseModel

from sshadapter import errors
from sshadapter.check.fixtures import _CASE_KEYS, _EXPECT_KEYS
from sshadapter.config import ConfigFile
from sshadapter.contract import codes
from sshadapter.contract.commandfile import CommandFile
from sshadapter.contract.params import PARAM_KEYWORDS
from sshadapter.contract.schemas import REFERENCE_FORMATS
from sshadapter.daemon import offload
from sshadapter.daemon.metrics import CLIENT_DROP_REASONS, Metrics
from sshadapter.errors import UpstreamError
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

DOCS = ROOT / "docs"
AUDIT_SCHEMA = DOCS / "audit-records.schema.json"
# evaluate.check_exit_status builds this reason itself: a failure the exit status declares.
DECLARED_EXIT_STATUS = "declared_exit_status"

_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
_CITATION = re.compile(r'docs/([a-z0-9-]+\.md)`?(?: "([^"]+)")?')
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def table_keys(path: Path, header: str = "key") -> set[str]:
    """The backticked first cells of every table whose first column is headed ``header``."""
    keys: set[str] = set()
    inside = False
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            inside = False
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] == header:
            inside = True
        elif inside and (match := _ROW.match(line)):
            keys.add(match.group(1))
    return keys


def _models_in(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """(suffix, model) for each model an annotation holds: "" as is, ".*" as a table's values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    if get_origin(annotation) is dict:
        return [(".*" + suffix, model) for suffix, model in _models_in(get_args(annotation)[1])]
    return [found for arg in get_args(annotation) for found in _models_in(arg)]


def model_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every key a model takes, dotted, with `*` for the names of a table of tables."""
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        yield key
        for suffix, nested in _models_in(field.annotation):
            if suffix:
                yield key + suffix
            yield from model_keys(nested, f"{key}{suffix}.")


def command_file_keys() -> set[str]:
    """Every key of a command file: the models', and the keywords a parameter may use."""
    return {
        *model_keys(CommandFile),
        "params.*",
        *(f"params.*.{keyword}" for keyword in PARAM_KEYWORDS),
    }


def test_the_key_list_is_derived_from_the_models() -> None:
    """The derivation reaches every nested table: the stderr case, fresh, allow and params."""
    keys = command_file_keys()
    for key in (
        "output.schema",
        "output.exit_codes.*.if_stderr_matches",
        "checks.fresh.max_skew_seconds",
        "allow.groups",
        "params.*.exclusiveMaximum",
        "retry.on",
    ):
        assert key in keys


def test_every_command_file_key_is_documented() -> None:
    """docs/command-files.md has a row for each key the loader takes, and for no other."""
    documented = table_keys(DOCS / "command-files.md")
    keys = command_file_keys()
    assert not keys - documented, f"keys without a row: {sorted(keys - documented)}"
    assert not documented - keys, f"rows for keys the loader refuses: {sorted(documented - keys)}"


def test_every_config_section_and_key_is_documented() -> None:
    """Each config section is a row of docs/operations.md; each key is in config.example.toml."""
    documented = table_keys(DOCS / "operations.md")
    example = tomllib.loads((ROOT / "config.example.toml").read_text())
    for name, field in ConfigFile.model_fields.items():
        for suffix, section in _models_in(field.annotation):
            assert f"[{name}{suffix}]" in documented, f"[{name}{suffix}] has no row"
            found = example.get(name, {})
            if isinstance(found, list):  # an array of tables, [[grants]]
                tables = found
            else:
                tables = list(found.values()) if suffix else [found]
            written = {key for table in tables for key in table}
            assert written, f"config.example.toml has no [{name}{suffix}]"
            for key, sub in section.model_fields.items():
                assert key in written, f"{name}{suffix}.{key} is not in config.example.toml"
                for _, nested in _models_in(sub.annotation):
                    inner = {k for table in tables for k in table.get(key, {})}
                    missing = set(nested.model_fields) - inner
                    assert not missing, f"{name}{suffix}.{key}: {sorted(missing)} not shown"


def test_every_code_stage_and_reason_is_documented() -> None:
    """docs/protocol.md names every error code, stage and reason the daemon can produce."""
    text = (DOCS / "protocol.md").read_text()
    names = {
        *codes.CODES,
        *errors.STAGES,
        *errors.REQUEST_REASONS,
        *errors.TRANSPORT_REASONS,
        *errors.DAEMON_REASONS,
        *errors.APPROVAL_REASONS,
        *(reason for reasons in errors.EVIDENCE_REASONS.values() for reason in reasons),
        *(reason for reasons in errors.DISPATCH_REASONS.values() for reason in reasons),
        DECLARED_EXIT_STATUS,
    }
    missing = sorted(name for name in names if f"`{name}`" not in text)
    assert not missing, f"not in docs/protocol.md: {missing}"


def test_the_evaluation_worker_bounds_are_documented_as_in_the_code() -> None:
    """docs/ gives the evaluation workers' wait bound, exit grace and pool limit as offload.py."""
    operations = (DOCS / "operations.md").read_text()
    protocol = (DOCS / "protocol.md").read_text()
    wait = f"{offload.JUDGE_TIMEOUT_SECONDS:g}"
    assert f"longer than {wait} s\n(`offload.JUDGE_TIMEOUT_SECONDS`" in operations
    assert f"within {wait}s`" in operations  # the log line
    assert f"within {wait} s (`offload.JUDGE_TIMEOUT_SECONDS`)" in protocol
    grace = f"{offload.WORKER_EXIT_GRACE_SECONDS:g} s"
    assert f"{grace}\n     after being told to, `offload.WORKER_EXIT_GRACE_SECONDS`" in operations
    assert offload.MAX_POOL_FAILURES == 3 and "after three failures" in operations
    assert offload.MAX_JUDGE_ATTEMPTS == 2 and "judged again in the new workers" in operations


def test_every_metric_is_documented() -> None:
    """docs/metrics.md has a row for each metric the daemon exports, and names each drop reason."""
    metrics = Metrics()
    metrics.watch_connections(dict)
    metrics.watch_credentials(dict)
    metrics.watch_tunnels(dict)
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in metrics.registry.collect()
    }
    path = DOCS / "metrics.md"
    documented = table_keys(path, "metric")
    assert exported == documented
    text = path.read_text()
    assert all(f"`{reason}`" in text for reason in CLIENT_DROP_REASONS)


def test_every_fixture_key_is_documented() -> None:
    """docs/fixtures.md has a row for each key a case file may hold, and for no other."""
    keys = {*_CASE_KEYS, *(f"expect.{key}" for keys in _EXPECT_KEYS.values() for key in keys)}
    assert table_keys(DOCS / "fixtures.md") == keys


def _headings(path: Path) -> set[str]:
    """A document's headings, backticks dropped; `#` lines inside code blocks are no headings."""
    prose = re.sub(r"^ *```.*?^ *```", "", path.read_text(), flags=re.M | re.S)
    return {h.replace("`", "") for h in _HEADING.findall(prose)}


def _documents() -> list[Path]:
    """The repository's Markdown files, not those of caches, virtualenvs, builds or npm."""
    return sorted(
        path
        for path in ROOT.glob("**/*.md")
        if not any(
            part.startswith(".")
            or part.endswith(".egg-info")
            or part in ("build", "dist", "node_modules")
            for part in path.relative_to(ROOT).parts[:-1]
        )
    )


def test_every_cited_section_exists() -> None:
    """Each `docs/FILE.md "Section"` cited in code, tests, units or documents is a heading there."""
    sources = [
        *ROOT.glob("sshadapter/**/*.py"),
        *(p for p in ROOT.glob("tests/**/*.py") if "node_modules" not in p.parts),
        *ROOT.glob("systemd/*"),
        *ROOT.glob("prometheus/*"),
        ROOT / "config.example.toml",
        *_documents(),
    ]
    cited = 0
    for source in sources:
        for file, section in _CITATION.findall(source.read_text()):
            target = DOCS / file
            assert target.is_file(), f"{source.name} cites docs/{file}, which does not exist"
            if section:
                cited += 1
                section = " ".join(section.split())  # a citation may wrap across lines
                assert section in _headings(target), f'{source.name}: docs/{file} "{section}"'
    assert cited > 20  # the code cites sections: the pattern still finds them


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_relative_link_resolves_inside_the_repository() -> None:
    """No document links outside the checkout (a clone has no ../shared) or to a missing file."""
    for document in _documents():
        for target in _LINK.findall(document.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (document.parent / path).resolve() if path else document
            assert resolved.is_relative_to(ROOT), f"{document.name}: {target} leaves the repository"
            assert resolved.exists(), f"{document.name}: {target} does not exist"
            if anchor:
                slugs = {_slug(h) for h in _headings(resolved)}
                assert anchor in slugs, f"{document.name}: no heading for #{anchor}"


def _commands(*path: str) -> Iterator[tuple[str, ...]]:
    """Every command ``sshadapter [path] --help`` lists, its subcommands in place of a group."""
    sshadapter = Path(sys.executable).with_name("sshadapter")
    helped = subprocess.run(
        [str(sshadapter), *path, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=60,
    ).stdout
    listing = re.search(r"^  [A-Z]+\n((?:    .*\n|      .*\n)+)", helped, re.M)
    if listing is None:
        yield path
        return
    for name in re.findall(r"^    ([a-z][a-z-]*)(?:  |$)", listing[1], re.M):
        yield from _commands(*path, name)


def test_the_readme_lists_every_command() -> None:
    """README "The command line" names each command and subcommand `sshadapter --help` gives."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The command line") :]
    block = section[section.index("```sh\n") : section.index("\n```\n")]
    lines = [line.split()[1:] for line in block.splitlines() if line.startswith("sshadapter ")]
    commands = list(_commands())
    assert len(commands) > 20  # the help's listing is still found
    for command in commands:
        assert any(
            len(words) >= len(command)
            and all(name in words[i].split("|") for i, name in enumerate(command))
            for words in lines
        ), " ".join(command)


# The audit records ------------------------------------------------------------------


def audit_schema() -> dict[str, Any]:
    schema: dict[str, Any] = orjson.loads(AUDIT_SCHEMA.read_bytes())
    return schema


def test_the_audit_schema_is_valid_and_its_lists_are_the_codes() -> None:
    """docs/audit-records.schema.json is Draft 2020-12, and its enums are the code's own lists."""
    schema = audit_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    defs = schema["$defs"]
    reasons = {
        *errors.REQUEST_REASONS,
        *errors.TRANSPORT_REASONS,
        *errors.DAEMON_REASONS,
        *errors.APPROVAL_REASONS,
        *(reason for reasons in errors.EVIDENCE_REASONS.values() for reason in reasons),
        *(reason for reasons in errors.DISPATCH_REASONS.values() for reason in reasons),
        DECLARED_EXIT_STATUS,
    }
    assert defs["code"]["enum"] == list(codes.CODES)
    assert defs["stage"]["enum"] == list(errors.STAGES)
    assert set(defs["reason"]["enum"]) == reasons
    assert set(defs["transport_reason"]["enum"]) == errors.TRANSPORT_REASONS
    approval = defs["approval"]["properties"]["reason"]["enum"]
    assert set(approval) == errors.APPROVER_REFUSALS | errors.APPROVAL_CANCELLATIONS


def _answer(result: RunResult) -> Any:
    async def answer() -> RunResult:
        return result

    return answer


def _raising(exc: Exception) -> Any:
    async def answer() -> RunResult:
        raise exc

    return answer


def _calls_of_every_kind(tmp_path: Path) -> list[dict[str, Any]]:
    """A daemon run with a success, a retry, declared failures, rejections, a refused call, a
    denied one, a transport failure and a bug; the records it wrote."""
    commands = shipped_commands(tmp_path)
    review = commands / "review_status.toml"
    review.write_text(
        review.read_text().replace(
            'allow = { groups = ["sshadapter-agents"] }',
            f"allow = {{ uids = [{os.getuid() + 4242}] }}",
        )
    )
    retried = [
        RunResult(b"", b"api down\n", 75),
        RunResult(orjson.dumps(_job("retrybird")), b"", 0),
    ]

    async def flaky() -> RunResult:
        return retried.pop(0)

    job = "ci-cli run status --json --project "
    runner = ScriptedRunner(
        {
            JOB_COMMAND: RunResult(orjson.dumps(JOB_OUT), b"", 0),
            job + "retrybird": flaky,
            job + "gone": RunResult(b"", b"no such project\n", 4),
            job + "badstate": RunResult(
                orjson.dumps({**_job("badstate"), "state": {"deploy": "now"}}), b"", 0
            ),
            "cat /proc/loadavg": RunResult(b"Last login: today\n0.07 0.11 0.05 1/80 2\n", b"", 0),
            "env LC_ALL=C df -P -k /data": _raising(
                UpstreamError("connect_refused", retryable=True, ran=False, detail="refused")
            ),
            "findmnt -J -o TARGET,SOURCE,FSTYPE,OPTIONS /": _raising(RuntimeError("a bug")),
        }
    )

    def call(tool: str, **args: str) -> dict[str, Any]:
        return {"op": "call", "tool": tool, "args": args}

    async def body(d: Running) -> None:
        codes = [
            (await d.ask(request)).get("error", {}).get("code")
            for request in (
                call("job_run_status", project_id="bluebird"),
                call("job_run_status", project_id="retrybird"),
                call("job_run_status", project_id="gone"),
                call("job_run_status", project_id="badstate"),
                call("job_run_status", project_id="NO!"),
                call("load_average"),
                call("review_status", change_id="CR-1"),
                call("disk_usage", path="/data"),
                call("mount_info", target="/"),
                call("no_such_tool"),
            )
        ]
        assert codes == [
            None,
            None,
            "NOT_FOUND",
            "INVALID_RESPONSE",
            "INVALID_REQUEST",
            "INVALID_RESPONSE",
            "DENIED",
            "UPSTREAM_UNAVAILABLE",
            "INTERNAL",
            "INVALID_REQUEST",
        ]

    with_daemon(tmp_path, body, runner=runner, commands=commands, quarantine=True)
    return _records(tmp_path / "audit.jsonl")


def _job(project: str) -> dict[str, Any]:
    return {**JOB_OUT, "project_id": project}


def _overloaded_then_cut(tmp_path: Path) -> list[dict[str, Any]]:
    """One slot and no queue: a second call is OVERLOADED; the first, hanging, is cut by the
    drain deadline; the records it wrote."""

    async def hang() -> RunResult:
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    call = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}

    async def body(d: Running) -> None:
        first = asyncio.create_task(d.ask(call))
        for _ in range(500):
            if d.service.calls and d.service.admission.admitted:
                break
            await asyncio.sleep(0.01)
        assert (await d.ask(call))["error"]["code"] == "OVERLOADED"
        d.daemon.stop()
        assert (await first)["error"] == {"code": "INTERNAL", "retryable": False}

    with_daemon(
        tmp_path,
        body,
        runner=ScriptedRunner({JOB_COMMAND: hang}),
        max_concurrent_calls=1,
        max_queue=0,
        drain_timeout_seconds=0.3,
    )
    return _records(tmp_path / "audit.jsonl")


def _records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_records_a_real_daemon_writes_match_the_audit_schema(tmp_path: Path) -> None:
    """Every record of two daemon runs covering each kind of ending validates against the schema."""
    records = [*_calls_of_every_kind(tmp_path / "a"), *_overloaded_then_cut(tmp_path / "b")]
    schema = audit_schema()
    whole = jsonschema.Draft202012Validator(schema, format_checker=REFERENCE_FORMATS)
    by_type = {
        kind: jsonschema.Draft202012Validator(
            {**{k: v for k, v in schema.items() if k != "oneOf"}, "$ref": f"#/$defs/{kind}"},
            format_checker=REFERENCE_FORMATS,
        )
        for kind in ("start", "intent", "result")
    }
    for record in records:
        # Against its own type's definition first: its errors name the field.
        found = [f"{e.json_path}: {e.message}" for e in by_type[record["type"]].iter_errors(record)]
        assert not found, f"{record['type']} record {record.get('request_id')}: {found}"
        assert whole.is_valid(record)
    # The runs reached every shape the schema describes, so its rules were exercised.
    results = [r for r in records if r["type"] == "result"]
    attempts = [a for r in results for a in r["attempts"]]
    assert {r["type"] for r in records} == {"start", "intent", "result"}
    assert {r["stage"] for r in results} == {
        None,
        "request",
        "authorize",
        "transport",
        "exit",
        "extract",
        "schema",
        "admission",
        "internal",
        "shutdown",
    }
    assert any(len(r["attempts"]) == 2 for r in results)  # the retry
    assert any(r["attempts"] == [] for r in results)  # refused before anything ran
    assert any(a.get("quarantine", {}).get("stdout") for a in attempts)
    assert any(a["transport_error"] for a in attempts)
    assert {a.get("interrupted") for a in attempts} == {None, "bug", "drain_deadline"}
    # A request naming no known tool leaves no record.
    assert all(r.get("tool") != "no_such_tool" for r in records)
