"""The command line, run as an operator runs it: ``python -m sshadapter.cli`` in a subprocess.

Without ``--config`` the CLI reads ./commands and ./schemas, so each test picks
its working directory: the repository for the shipped examples, a copy in
tmp_path for a test that changes one file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_SECONDS = 60  # `check` over the examples takes well under a second

NEAR_MISS_KINDS = {"banner", "trailing", "array_around", "error_beside_data"}
NEAR_MISS_PREFIXES = ("duplicate:", "null:", "extra_property:", "long_string:")
ROW_KEYS = {"tool", "case", "kind", "expected", "got", "ok", "rejection", "why"}


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSHADAPTER_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        check=False,
    )


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """A private copy of the shipped commands/ and schemas/ to change one file in."""
    for name in ("commands", "schemas"):
        shutil.copytree(REPO / name, tmp_path / name)
    return tmp_path


def edit_json(path: Path, change: Any) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value, indent=2))


def test_check_passes_on_the_examples() -> None:
    """`check` over the shipped examples exits 0 and its table ends with `0 missed`."""
    done = run_cli("check")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["tool", "case", "kind", "expected", "got"]
    assert lines[-1].endswith(", 0 missed")
    assert not any(line.endswith("MISS") for line in lines)
    # Without --config, said once: host aliases were not checked.
    assert done.stderr.splitlines() == [
        "sshadapter: note: no configuration file, so host aliases were not checked "
        "(give --config to check them)"
    ]


@pytest.mark.parametrize(("length", "warned"), [(47, False), (48, True)])
def test_check_warns_about_a_tool_name_too_long_for_mcp_hosts(
    examples: Path, length: int, warned: bool
) -> None:
    """A name over 47 characters (mcp__sshadapter__ + 47 = 64) is one warning; exit stays 0."""
    name = "load_average_" + "x" * (length - len("load_average_"))
    commands = examples / "commands"
    (commands / "load_average.toml").rename(commands / f"{name}.toml")
    (commands / "load_average.fixtures").rename(commands / f"{name}.fixtures")
    done = run_cli("check", cwd=examples)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "warning" in line]
    if warned:
        assert len(lines) == 1
        assert lines[0].startswith(f"sshadapter: warning: {commands / name}.toml: ")
        assert "48 characters" in lines[0] and "mcp__sshadapter__" in lines[0]
    else:
        assert lines == []


def test_check_json_lists_fixtures_and_near_misses() -> None:
    """`check --json` is a list of closed rows covering fixtures and every kind of near-miss."""
    done = run_cli("check", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list)
    assert rows
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["ok"] is True
        assert "request_id" not in row["got"]
        assert "request_id" not in json.dumps(row["got"])
    kinds = {row["kind"] for row in rows}
    assert {"fixture"} | NEAR_MISS_KINDS <= kinds
    for prefix in NEAR_MISS_PREFIXES:
        assert any(kind.startswith(prefix) for kind in kinds), prefix
    near_misses = [r for r in rows if r["kind"] != "fixture"]
    assert all(r["got"]["outcome"] == "failure" for r in near_misses)
    assert all(r["got"]["error"]["code"] == "INVALID_RESPONSE" for r in near_misses)
    assert all(r["rejection"] is not None for r in near_misses)


def test_a_field_the_schema_allows_to_be_null_gets_no_null_near_miss(examples: Path) -> None:
    """A `["string", "null"]` field: null is accepted, so `check` derives no null miss for it."""

    def nullable(schema: Any) -> None:
        schema["properties"]["revision"]["type"] = ["string", "null"]

    edit_json(examples / "schemas" / "deploy_status.v1.json", nullable)
    done = run_cli("check", "--json", cwd=examples)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = {(row["tool"], row["kind"]) for row in json.loads(done.stdout)}
    assert ("deploy_status", "null:/revision") not in kinds
    assert ("deploy_status", "null:/state") in kinds  # the schema still refuses null there


def test_check_reports_a_changed_expectation_as_a_miss(examples: Path) -> None:
    """An accepted fixture whose expected data no longer matches makes check exit 1 with MISS."""
    case = examples / "commands" / "job_run_status.fixtures" / "failed_recent.case.json"
    edit_json(case, lambda v: v["expect"]["data"].update(state="running"))
    done = run_cli("check", cwd=examples)
    assert done.returncode == 1, done.stderr
    misses = [line for line in done.stdout.splitlines() if line.endswith("MISS")]
    assert len(misses) == 1
    assert misses[0].split()[:3] == ["job_run_status", "failed_recent", "fixture"]
    assert done.stdout.splitlines()[-1].endswith(", 1 missed")


def test_check_json_marks_the_miss(examples: Path) -> None:
    """The same miss in --json: one row with ok false, and the data actually produced."""
    case = examples / "commands" / "job_run_status.fixtures" / "failed_recent.case.json"
    edit_json(case, lambda v: v["expect"]["data"].update(state="running"))
    done = run_cli("check", "--json", cwd=examples)
    assert done.returncode == 1
    missed = [row for row in json.loads(done.stdout) if not row["ok"]]
    assert [(r["tool"], r["case"], r["kind"]) for r in missed] == [
        ("job_run_status", "failed_recent", "fixture")
    ]
    assert missed[0]["got"]["data"]["state"] == "failed"


def test_bad_command_file_is_one_line_naming_file_and_key(examples: Path) -> None:
    """A bad command file: exit 2, one stderr line with the file and the key, no traceback."""
    path = examples / "commands" / "job_run_status.toml"
    path.write_text(path.read_text().replace("version = 1\n", "version = 1\nverison = 2\n", 1))
    done = run_cli("check", cwd=examples)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0] == f"sshadapter: {path}: verison: unknown key"


def test_bad_schema_file_is_one_line_naming_file_and_pointer(examples: Path) -> None:
    """A schema the lint refuses: exit 2, one stderr line with the file and the pointer."""
    path = examples / "schemas" / "review_status.v1.json"

    def unbound(schema: dict[str, Any]) -> None:
        del schema["properties"]["reviewed_by"]["pattern"]
        del schema["properties"]["reviewed_by"]["maxLength"]

    edit_json(path, unbound)
    done = run_cli("check", cwd=examples)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"sshadapter: {path}: /properties/reviewed_by: string has no bound")


@pytest.mark.parametrize(
    ("args", "key", "phrase"),
    [
        ({"path": "../etc"}, "args.path", "does not match"),
        ({"path": "/", "extra": "x"}, "args", "'extra' was unexpected"),
        ({}, "args", '"path" is a required property'),
    ],
    ids=["pattern", "extra", "missing"],
)
def test_fixture_with_arguments_an_agent_cannot_send_is_refused(
    examples: Path, args: dict[str, Any], key: str, phrase: str
) -> None:
    """A fixture whose args fail the parameter schema: exit 2, one line naming file, key, reason."""
    case = examples / "commands" / "disk_usage.fixtures" / "root.case.json"
    edit_json(case, lambda v: v.update(args=args))
    done = run_cli("check", cwd=examples)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"sshadapter: {case}: {key}: fails the parameter schema: ")
    assert phrase in lines[0]


def test_config_hosts_are_checked(tmp_path: Path) -> None:
    """With --config, a command whose host alias is not configured is refused by name."""
    config = tmp_path / "config.toml"
    config.write_text(
        f'[paths]\ncommands = "{REPO / "commands"}"\nschemas = "{REPO / "schemas"}"\n\n'
        '[hosts.ci]\naddress = "ci.example.invalid"\nuser = "agent"\n'
        'known_hosts = "known_hosts"\n'
    )
    done = run_cli("check", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1
    assert ": host: no [hosts.local] in the configuration" in lines[0]


def test_check_reports_an_unparseable_accepted_fixture_as_a_miss(examples: Path) -> None:
    """An accepted fixture whose stdout no longer parses is a MISS (exit 1), not a traceback."""
    stdout = examples / "commands" / "job_run_status.fixtures" / "failed_recent.stdout"
    stdout.write_bytes(stdout.read_bytes() + b"garbage\n")
    done = run_cli("check", cwd=examples)
    assert "Traceback" not in done.stderr
    assert done.returncode == 1


def test_schema_prints_the_envelope_schema() -> None:
    """`schema job_run_status` prints an object schema whose oneOf has two branches for it."""
    done = run_cli("schema", "job_run_status")
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema["type"] == "object"
    assert len(schema["oneOf"]) == 2
    for branch in schema["oneOf"]:
        assert branch["properties"]["tool"] == {"const": "job_run_status"}
    assert {b["properties"]["outcome"]["const"] for b in schema["oneOf"]} == {"success", "failure"}
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_describes_the_envelopes_check_produces() -> None:
    """The printed schema accepts an accepted fixture's envelope and refuses an extra field."""
    schema = json.loads(run_cli("schema", "job_run_status").stdout)
    case = REPO / "commands" / "job_run_status.fixtures" / "failed_recent.case.json"
    data = json.loads(case.read_text())["expect"]["data"]
    envelope = {
        "tool": "job_run_status",
        "request_id": "req.0123456789ab",
        "outcome": "success",
        "data": data,
    }
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(envelope)
    assert not validator.is_valid({**envelope, "data": {**data, "log_tail": "x"}})
    assert not validator.is_valid({**envelope, "note": "x"})


def test_schema_of_unknown_tool_exits_2() -> None:
    """`schema nope` names the tool on stderr and exits 2."""
    done = run_cli("schema", "nope")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "'nope'" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_no_subcommand_exits_2() -> None:
    """Running the CLI with no subcommand prints usage and exits 2."""
    done = run_cli()
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("usage: sshadapter")


def serve_config(tmp_path: Path, **paths: Path) -> Path:
    """A config for `serve` whose audit, quarantine and socket paths a test chooses."""
    audit = paths.get("audit", tmp_path / "log" / "audit.jsonl")
    quarantine = paths.get("quarantine", tmp_path / "quarantine")
    sock = paths.get("socket", tmp_path / "run" / "sshadapter.sock")
    config = tmp_path / "config.toml"
    config.write_text(f"""\
[server]
socket_path = "{sock}"
evaluation_workers = 0
[paths]
commands = "{REPO / "commands"}"
schemas = "{REPO / "schemas"}"
[audit]
path = "{audit}"
quarantine_dir = "{quarantine}"
[hosts.ci]
address = "127.0.0.1"
user = "nobody"
known_hosts = "{tmp_path / "known_hosts"}"
[hosts.local]
address = "127.0.0.1"
user = "nobody"
known_hosts = "{tmp_path / "known_hosts"}"
""")
    return config


@pytest.mark.parametrize(
    "case",
    [
        "audit_symlink",
        "quarantine_file",
        "socket_dir_symlink",
        "audit_dir_uncreatable",
        "audit_mode",
    ],
)
def test_serve_start_up_errors_are_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    """A path `serve` cannot use: one line naming the path and the reason, exit 2, no traceback."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if case == "audit_symlink":
        (tmp_path / "log").mkdir()
        (tmp_path / "log" / "audit.jsonl").symlink_to(elsewhere / "audit.jsonl")
        config, named = serve_config(tmp_path), tmp_path / "log" / "audit.jsonl"
    elif case == "quarantine_file":
        (tmp_path / "quarantine").write_text("not a directory")
        config, named = serve_config(tmp_path), tmp_path / "quarantine"
    elif case == "socket_dir_symlink":
        (tmp_path / "run").symlink_to(elsewhere)
        config, named = serve_config(tmp_path), tmp_path / "run"
    elif case == "audit_dir_uncreatable":
        (tmp_path / "file").write_text("")
        named = tmp_path / "file" / "log"
        config = serve_config(tmp_path, audit=named / "audit.jsonl")
    else:
        (tmp_path / "log").mkdir()
        (tmp_path / "log" / "audit.jsonl").write_text("")
        (tmp_path / "log" / "audit.jsonl").chmod(0o644)
        config, named = serve_config(tmp_path), tmp_path / "log" / "audit.jsonl"
    done = run_cli("serve", "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("sshadapter: ")]
    assert len(errors) == 1 and errors[0].startswith(f"sshadapter: {named}: "), done.stderr


def test_a_schema_miss_shows_the_detail_and_both_paths(examples: Path) -> None:
    """A schema miss shows the validator's reason and both paths, not only `schema_mismatch`.

    For a fixture rejected at the schema stage, in the table and in --json."""
    out = examples / "commands" / "job_run_status.fixtures" / "failed_recent.stdout"
    edit_json(out, lambda v: v.update(run_id=7))
    done = run_cli("check", cwd=examples)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    miss = next(i for i, line in enumerate(lines) if "failed_recent" in line and "MISS" in line)
    assert lines[miss + 1].startswith("    why: schema/schema_mismatch at /run_id (schema /")
    assert "is not of type" in lines[miss + 1]
    rows = json.loads(run_cli("check", "--json", cwd=examples).stdout)
    (row,) = [r for r in rows if r["case"] == "failed_recent" and r["kind"] == "fixture"]
    assert row["rejection"]["instance_path"] == "/run_id"
    assert row["rejection"]["schema_path"].startswith("/properties/run_id")
    assert "is not of type" in row["rejection"]["detail"] and row["why"].startswith("schema/")


def test_check_refuses_a_warm_name_that_is_no_host(tmp_path: Path) -> None:
    """`[pool] warm` naming an alias not in [hosts]: `check` refuses it in one line, as serve."""
    config = tmp_path / "config.toml"
    hosts = "".join(
        f'[hosts.{alias}]\naddress = "{alias}.example.invalid"\nuser = "agent"\n'
        'known_hosts = "known_hosts"\n\n'
        for alias in ("ci", "local")
    )
    config.write_text(
        f'[paths]\ncommands = "{REPO / "commands"}"\nschemas = "{REPO / "schemas"}"\n\n'
        f'[pool]\nwarm = ["ci", "db"]\n\n{hosts}'
    )
    done = run_cli("check", "--config", str(config), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"sshadapter: {config}: pool.warm: 'db' is no host alias and no group\n"
