"""sshadapter-dispatch and its policy, without sshd: parsing, matching, refusals, the generator.

The dispatcher (sshadapter/dispatch/dispatcher.py) is imported here as a module for the
property tests and run as a file, as sshd runs it, for everything that
touches the process (environment, stdin, signals, exit status, the log).
tests/dispatch/test_dispatch_sshd.py does the same through a real sshd.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from dispatch_support import (
    DISPATCHER_SOURCE,
    REFUSAL,
    ROOT,
    daemon_would_send,
    modules_imported,
    policy_for,
    read_log,
    run_dispatcher,
    shipped_registry,
    syslog_listener,
    valid_args,
    write_policy,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sshd import host_directory, policy_owner_args
from test_schema_agreement import HOT_DATE_TIME, date_time_like

from sshadapter.check.fixtures import load_fixtures
from sshadapter.cli import main as cli_main
from sshadapter.contract import argv as argv_module
from sshadapter.contract import exitstatus
from sshadapter.contract.registry import Registry, load_registry
from sshadapter.dispatch import dispatcher, policy
from sshadapter.dispatch.patterns import translate
from sshadapter.errors import ConfigError

REGISTRY = shipped_registry()
POLICIES = policy.host_policies(REGISTRY)
OPERATIONS = sorted(REGISTRY.operations.values(), key=lambda op: op.name)
# The owner the dispatcher trusts here besides root (the tests' own uid when not root).
OWNER = os.geteuid()


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """pytest's tmp_path is under /tmp (1777), where the dispatcher reads no policy: a
    directory only root (or this uid, when not root) can write instead."""
    with host_directory() as directory:
        yield directory


def refusal(policy_doc: Mapping[str, Any], command: bytes | None) -> str:
    with pytest.raises(dispatcher.Refused) as info:
        dispatcher.decide(command, policy_doc)
    return info.value.reason


def sealed(body: dict[str, Any]) -> dict[str, Any]:
    """A hand-made policy with its digest, as the generator would seal it."""
    body = {"format": policy.POLICY_FORMAT, "host": "h", **body}
    return {**body, "digest": policy.digest(body)}


# What the daemon and the dispatcher agree on --------------------------------------------


def test_the_protocol_constants_are_the_same_on_both_sides() -> None:
    """Refusal status and line, digest command and format: one value each, on both ends."""
    assert dispatcher.REFUSED_STATUS == exitstatus.REFUSED_STATUS == 77
    assert dispatcher.REFUSAL_PREFIX.encode() == exitstatus.REFUSAL_PREFIX
    assert dispatcher.DIGEST_COMMAND == policy.DIGEST_COMMAND
    assert dispatcher.POLICY_FORMAT == policy.POLICY_FORMAT
    daemon_limit = getattr(argv_module, "MAX_COMMAND_BYTES", 64 * 1024)
    assert daemon_limit <= dispatcher.MAX_COMMAND_BYTES


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda x: st.lists(x) | st.dictionaries(st.text(), x),
    )
)
def test_both_sides_take_digests_over_the_same_bytes(value: Any) -> None:
    """canonical_json is byte-identical in the generator and the dispatcher."""
    assert dispatcher.canonical_json(value) == policy.canonical_json(value)


@given(st.text())
def test_the_dispatcher_quotes_exactly_as_shlex_quote(text: str) -> None:
    """Its quote is the daemon's shlex.quote, so the canonical check is the daemon's form."""
    assert dispatcher.quote(text) == shlex.quote(text)


def test_no_command_the_daemon_writes_starts_like_the_digest_command() -> None:
    """shlex.quote quotes "#": no operation's command can be the reserved one."""
    assert shlex.quote("#sshadapter-policy-digest") != policy.DIGEST_COMMAND
    assert shlex.quote("#x").startswith("'")


@given(st.lists(st.text(), min_size=1, max_size=8))
def test_split_inverts_the_daemons_quoting(argv: list[str]) -> None:
    """For any argv, splitting the daemon's command gives it back, element for element."""
    command = " ".join(shlex.quote(element) for element in argv)
    assert dispatcher.split_command(command) == argv
    assert shlex.split(command) == argv  # the reference inverse agrees


@pytest.mark.parametrize(
    "command",
    [
        '"df" -P',
        "df  -P",
        "df -P ",
        " df",
        "df\t-P",
        "df\\ -P",
        "'df' -P",
        "'unclosed",
        "$HOME",
        "a'b'",
        "'a'b",
        "df -P;id",
        "df -P `id`",
        "df $(id)",
        "x\ny",
        "''''",
    ],
)
def test_any_other_spelling_is_refused(command: str) -> None:
    """Only the daemon's own form passes: no other quoting, spacing or shell syntax."""
    with pytest.raises(dispatcher.Refused) as info:
        dispatcher.split_command(command)
    assert info.value.reason == "not_canonical"


# Every shipped operation and fixture, and random valid arguments -------------------------


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_every_fixtures_arguments_pass_with_the_daemons_argv(op: Any) -> None:
    """The arguments of every fixture are accepted as exactly the argv the daemon means."""
    assert_fixture_arguments_pass(REGISTRY, op)


def assert_fixture_arguments_pass(registry: Registry, op: Any) -> None:
    """Every fixture of ``op`` has arguments its host's policy maps to the daemon's argv."""
    cases = load_fixtures(op) or []
    assert cases, f"{op.name} has no fixtures"
    for fixture in cases:
        command = op.command(fixture.args)
        name, argv = dispatcher.decide(command.encode(), policy_for(registry, op))
        assert (name, argv) == (op.name, op.argv.argv(fixture.args))


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_random_valid_arguments_give_the_daemons_argv(op: Any, data: st.DataObject) -> None:
    """For random arguments the daemon accepts, the host runs exactly the daemon's argv."""
    assert_valid_arguments_pass(REGISTRY, op, data)


def assert_valid_arguments_pass(registry: Registry, op: Any, data: st.DataObject) -> None:
    """Arguments drawn from ``op``'s parameter schemas run as exactly the daemon's argv."""
    args = data.draw(valid_args(op))
    name, argv = dispatcher.decide(op.command(args).encode(), policy_for(registry, op))
    assert (name, argv) == (op.name, op.argv.argv(args))


_MUTATION_CHARS = st.sampled_from([*"'\" $`;|&()<>\\\n\t*?~#-/.aZ09_=", "é", "\x00"])


@st.composite
def _mutated(draw: st.DrawFn, command: str) -> str:
    chars = list(command)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["insert", "delete", "replace", "append", "duplicate"]))
        at = draw(st.integers(0, len(chars)))
        if kind == "insert":
            chars.insert(at, draw(_MUTATION_CHARS))
        elif kind == "delete" and chars:
            del chars[min(at, len(chars) - 1)]
        elif kind == "replace" and chars:
            chars[min(at, len(chars) - 1)] = draw(_MUTATION_CHARS)
        elif kind == "append":
            chars += list(draw(st.sampled_from([" x", "; id", " $(id)", "\n", " ''", " -rf"])))
        elif kind == "duplicate":
            chars[at:at] = chars[at : at + draw(st.integers(1, 6))]
    return "".join(chars)


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_a_mutated_command_passes_only_if_the_daemon_could_have_sent_it(
    op: Any, data: st.DataObject
) -> None:
    """Random edits of a valid command: refused, unless the daemon would send that exact text."""
    assert_a_mutated_command_is_refused(REGISTRY, op, data)


def assert_a_mutated_command_is_refused(registry: Registry, op: Any, data: st.DataObject) -> None:
    """An edit of a valid command of ``op`` passes only as a command the daemon could send."""
    args = data.draw(valid_args(op))
    command = data.draw(_mutated(op.command(args)))
    expected = daemon_would_send(registry, op.spec.host, command)
    host_policy = policy_for(registry, op)
    try:
        name, argv = dispatcher.decide(command.encode("utf-8", "surrogatepass"), host_policy)
    except dispatcher.Refused as exc:
        assert expected == [] or exc.reason == "ambiguous", (command, expected, exc.reason)
    else:
        assert [name] == expected, command
        assert argv == shlex.split(command)


# A synthetic operation that uses every template feature ----------------------------------

SYNTHETIC = """\
description = "Every template feature."
version = 1
host = "h"
argv = ["/usr/bin/printf", "--project={project}", "{{literal}}", "{text}", "n={count}.", "{flag}",
        "{project}"]

[params.project]
type = "string"
pattern = '^[a-z0-9-]{1,20}$'

[params.text]
type = "string"
pattern = '^[^\\x00]{0,200}$'

[params.count]
type = "integer"
minimum = -5
maximum = 1000
multipleOf = 5

[params.flag]
type = "boolean"

[output]
format = "json"
schema = "load_average.v1.json"

[agent]
fields = ["load1"]
"""


def synthetic_registry(tmp_path: Path, text: str = SYNTHETIC, **more: str) -> Registry:
    commands = tmp_path / "commands"
    commands.mkdir(exist_ok=True)
    (commands / "synthetic.toml").write_text(text)
    for name, body in more.items():
        (commands / f"{name}.toml").write_text(body)
    registry = load_registry(commands, ROOT / "schemas", hosts=("h",), dispatch_hosts=("h",))
    policy.host_policies(registry)  # where a dispatch host's operations are refused
    return registry


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    return synthetic_registry(tmp_path_factory.mktemp("synthetic"))


_SYNTHETIC_ARGS = st.fixed_dictionaries(
    {
        "project": st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True),
        "text": st.text(max_size=200).filter(lambda t: "\x00" not in t),
        "count": st.integers(-1, 200).map(lambda n: n * 5),
        "flag": st.booleans(),
    }
)


@settings(max_examples=300, deadline=None)
@given(args=_SYNTHETIC_ARGS)
def test_any_text_in_any_element_shape_gives_back_the_daemons_argv(
    synthetic: Registry, args: dict[str, Any]
) -> None:
    """Prefixes, suffixes, literal braces, a parameter used twice, integers, booleans, any text."""
    op = synthetic.operations["synthetic"]
    op.check_args(args)
    name, argv = dispatcher.decide(op.command(args).encode(), policy.host_policies(synthetic)["h"])
    assert (name, argv) == ("synthetic", op.argv.argv(args))


@pytest.mark.parametrize(
    ("element", "value", "reason"),
    [
        (4, "n=05.", "bad_argument"),  # the daemon writes 5, never 05
        (4, "n=-0.", "bad_argument"),
        (4, "n=+5.", "bad_argument"),
        (4, "n=5.0.", "bad_argument"),
        (4, "n=1e1.", "bad_argument"),
        (4, "n=7.", "bad_argument"),  # not a multiple of 5
        (4, "n=1005.", "bad_argument"),  # over maximum
        (4, "n=-10.", "bad_argument"),  # under minimum
        (4, "n=" + "5" * 30 + ".", "bad_argument"),
        (4, "n=5", "no_match"),  # suffix missing
        (5, "True", "bad_argument"),
        (5, "1", "bad_argument"),
        (6, "other", "no_match"),  # {project} twice must be one value
        (1, "--project=UPPER", "bad_argument"),
        (1, "--project=a\n", "bad_argument"),
    ],
)
def test_a_value_the_daemon_would_not_have_written_is_refused(
    synthetic: Registry, element: int, value: str, reason: str
) -> None:
    """Typed placeholders accept only the daemon's own rendering of a valid value."""
    op = synthetic.operations["synthetic"]
    argv = op.argv.argv({"project": "p", "text": "t", "count": 5, "flag": True})
    argv[element] = value
    if element == 1:
        argv[6] = value.removeprefix("--project=")
    command = " ".join(shlex.quote(e) for e in argv)
    assert refusal(policy.host_policies(synthetic)["h"], command.encode()) == reason


@settings(max_examples=2000)
@given(date_time_like | st.text(max_size=40))
def test_the_dispatchers_date_time_is_the_daemons(text: str) -> None:
    """format: date-time on the host accepts exactly what jsonschema-rs accepts."""
    assert dispatcher.is_date_time(text) == HOT_DATE_TIME.is_valid(text)


def test_a_date_time_parameter_is_checked_on_the_host(tmp_path: Path) -> None:
    """A `format: date-time` parameter: a well-formed but impossible time is refused."""
    text = BASE.replace(
        "pattern = '^[a-z0-9-]{1,20}$'",
        "pattern = '^[0-9TtZz:.+-]{1,40}$'\nformat = \"date-time\"",
        1,
    )
    registry = synthetic_registry(tmp_path, text)
    op = registry.operations["synthetic"]
    doc = policy.host_policies(registry)["h"]
    assert doc["operations"]["synthetic"]["params"]["project"]["format"] == "date-time"
    base = {"text": "t", "count": 5, "flag": True}
    good = {**base, "project": "2024-12-31T23:59:60Z"}  # a leap second where one can be
    assert dispatcher.decide(op.command(good).encode(), doc) == ("synthetic", op.argv.argv(good))
    for impossible in ("2026-13-01T00:00:00Z", "2024-05-01T12:59:60Z", "2026-11-30T04:12:00"):
        bad = {**base, "project": impossible}
        assert not op.params_validator.is_valid(bad)  # the daemon refuses it too
        assert refusal(doc, op.command(bad).encode()) == "bad_argument"


# Refusals of the command itself --------------------------------------------------------


def test_the_commands_refused_before_any_matching() -> None:
    """No command, an over-long one, non-UTF-8 bytes: each refused with its own reason."""
    local = POLICIES["local"]
    assert refusal(local, None) == "no_command"
    assert refusal(local, b"") == "no_command"
    df = " ".join(REGISTRY.operations["disk_usage"].argv.argv({"path": "/"})[:-1]).encode()
    assert refusal(local, df + b" /" + b"a" * dispatcher.MAX_COMMAND_BYTES) == "too_long"
    assert refusal(local, df + b" /\xff") == "not_utf8"
    assert refusal(local, b"cat /etc/shadow") == "no_match"
    assert refusal(local, df + b" ../etc") == "bad_argument"
    assert refusal(POLICIES["ci"], b"cat /proc/loadavg") == "no_match"  # other host


def test_a_command_two_operations_accept_is_refused_as_ambiguous() -> None:
    """Two operations that accept one argv: the dispatcher will not pick one."""
    op = {"argv": ["cat", {"param": "p"}], "params": {"p": {"type": "string", "pattern": "\\A/"}}}
    doc = sealed({"operations": {"one": op, "two": op}})
    assert refusal(doc, b"cat /proc/loadavg") == "ambiguous"


# The policy file -----------------------------------------------------------------------


def test_a_policy_edited_by_hand_or_cut_short_is_refused(tmp_path: Path) -> None:
    """A changed byte breaks the digest; a bad key, type or keyword is not guessed at."""
    good = dict(POLICIES["local"])
    path = write_policy(tmp_path / "p.json", good)
    assert dispatcher.read_policy(str(path), OWNER) == good
    loosened = json.loads(json.dumps(good))
    loosened["operations"]["disk_usage"]["params"]["path"]["pattern"] = ".*"
    variants: list[Any] = [
        loosened,
        {**good, "extra": 1},
        {**good, "format": "sshadapter-dispatch-policy/2"},
    ]
    for keyword in ("patern", "description", "minItems"):
        broken = json.loads(json.dumps(good))
        broken["operations"]["disk_usage"]["params"]["path"][keyword] = 1
        body = {k: v for k, v in broken.items() if k != "digest"}
        variants.append({**broken, "digest": policy.digest(body)})  # resealed: still refused
    for variant in variants:
        write_policy(path, variant)
        with pytest.raises(dispatcher.Refused, match="policy_invalid"):
            dispatcher.read_policy(str(path), OWNER)
    for raw in (b"{", b'{"a": 1, "a": 2}', b"\xff", b"[" * 100000):
        path.write_bytes(raw)
        with pytest.raises(dispatcher.Refused, match="policy_invalid"):
            dispatcher.read_policy(str(path), OWNER)
    path.write_bytes(b" " * (dispatcher.MAX_POLICY_BYTES + 1))
    with pytest.raises(dispatcher.Refused, match="policy_unreadable"):
        dispatcher.read_policy(str(path), OWNER)
    with pytest.raises(dispatcher.Refused, match="policy_unreadable"):
        dispatcher.read_policy(str(tmp_path / "missing.json"), OWNER)


NOBODY = 65534  # an owner that is neither root nor the tests' uid


def _refused_with(path: Path | str, reason: str, *, log: Path, owner: str | None = None) -> str:
    """Run the dispatcher on ``path``: refused for ``reason``; returns its log line."""
    argv = [sys.executable, "-IS", str(DISPATCHER_SOURCE), "--log-socket", str(log)]
    argv += ["--policy-owner", owner] if owner is not None else policy_owner_args()
    log.unlink(missing_ok=True)  # the last listener's socket file
    with syslog_listener(log) as listener:
        done = subprocess.run(
            [*argv, str(path)],
            env={"SSH_ORIGINAL_COMMAND": "cat /proc/loadavg"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        lines = read_log(listener)
    assert done.returncode == dispatcher.REFUSED_STATUS, (path, done.stdout)
    assert done.stdout == b"" and f"({reason})".encode() in done.stderr, (path, done.stderr)
    assert b"/" not in done.stderr.split(b")")[0]  # the client is not told the host's paths
    assert len(lines) == 1 and f"reason={reason} " in lines[0], lines
    return lines[0]


def test_a_policy_anyone_but_root_could_change_is_refused(tmp_path: Path) -> None:
    """StrictModes for the policy: one anyone but root could change is refused as policy_unsafe.

    A write bit for group or others, on the file or any directory above it, a symbolic link,
    or a relative path: refused, logged by path."""
    good = write_policy(tmp_path / "policy.json", POLICIES["local"])
    assert run_dispatcher(good, "cat /proc/loadavg").returncode == 0
    log = tmp_path / "log"

    good.chmod(0o666)
    assert f'path="{good}"' in _refused_with(good, "policy_unsafe", log=log)
    good.chmod(0o664)  # group write
    _refused_with(good, "policy_unsafe", log=log)
    good.chmod(0o644)
    for mode in (0o777, 0o1777, 0o775, 0o757):  # the directory: others could swap the file
        tmp_path.chmod(mode)
        line = _refused_with(good, "policy_unsafe", log=log)
        assert f'path="{tmp_path}"' in line, line
    tmp_path.chmod(0o755)
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    (tmp_path / "a").chmod(0o777)
    inner = write_policy(nested / "policy.json", POLICIES["local"])
    assert f'path="{tmp_path / "a"}"' in _refused_with(inner, "policy_unsafe", log=log)
    (tmp_path / "a").chmod(0o755)
    assert run_dispatcher(inner, "cat /proc/loadavg").returncode == 0

    link = tmp_path / "link.json"
    link.symlink_to(good)  # whoever made the link chose the file
    _refused_with(link, "policy_unsafe", log=log)
    (tmp_path / "dirlink").symlink_to(nested)
    _refused_with(tmp_path / "dirlink" / "policy.json", "policy_unsafe", log=log)
    for odd in (
        "policy.json",
        f"{tmp_path}/./policy.json",
        f"{tmp_path}/a/../policy.json",
        f"{tmp_path}//policy.json",
    ):
        _refused_with(odd, "policy_unsafe", log=log)  # as written in the forced command
    if os.geteuid() == 0:  # pytest's own directories are under /tmp, which is 1777
        under_tmp = write_policy(Path(tempfile.mkdtemp()) / "p.json", POLICIES["local"])
        try:
            assert '"/tmp"' in _refused_with(under_tmp, "policy_unsafe", log=log)
        finally:
            shutil.rmtree(under_tmp.parent)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_a_policy_owned_by_another_account_is_refused(tmp_path: Path) -> None:
    """A policy owned by the login account (or anyone but root) is refused, file or directory.

    --policy-owner in the forced command (root's) names one more owner, for tests."""
    log = tmp_path / "log"
    policy_file = write_policy(tmp_path / "policy.json", POLICIES["local"])
    os.chown(policy_file, NOBODY, NOBODY)
    _refused_with(policy_file, "policy_unsafe", log=log)
    assert run_dispatcher(policy_file, "cat /proc/loadavg").returncode == 77
    os.chown(policy_file, 0, 0)
    os.chown(tmp_path, NOBODY, NOBODY)
    assert f'path="{tmp_path}"' in _refused_with(policy_file, "policy_unsafe", log=log)

    # The escape for tests and development: owner named in the forced command only.
    done = subprocess.run(
        [
            sys.executable,
            "-IS",
            str(DISPATCHER_SOURCE),
            "--policy-owner",
            str(NOBODY),
            str(policy_file),
        ],
        env={"SSH_ORIGINAL_COMMAND": "cat /proc/loadavg"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    policy_file.chmod(0o666)  # still: nobody else may write it
    _refused_with(policy_file, "policy_unsafe", log=log, owner=str(NOBODY))
    for bad in ("-1", "root", "", "٣"):
        _refused_with(policy_file, "bad_invocation", log=log, owner=bad)


def test_a_policy_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO, a device or a directory in the policy's place: policy_unreadable, no hang."""
    log = tmp_path / "log"
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo, 0o644)
    started = time.monotonic()
    _refused_with(fifo, "policy_unreadable", log=log)
    assert time.monotonic() - started < 10  # a blocking open would wait for a writer
    (tmp_path / "dir.json").mkdir()
    _refused_with(tmp_path / "dir.json", "policy_unreadable", log=log)
    _refused_with(Path("/dev/null"), "policy_unsafe", log=log)  # 0666
    _refused_with(tmp_path / "missing.json", "policy_unreadable", log=log)


def _broken(change: Any) -> dict[str, Any]:
    """A one-operation policy with one thing wrong, sealed with a correct digest."""
    operation: dict[str, Any] = {
        "argv": ["cat", {"param": "p", "prefix": "--p="}],
        "params": {"p": {"type": "string", "pattern": "\\A[a-z]+\\Z"}},
    }
    change(operation)
    return sealed({"operations": {"x": operation}})


@pytest.mark.parametrize(
    "change",
    [
        lambda op: op.update(argv="cat"),
        lambda op: op.update(argv=[]),
        lambda op: op.update(argv=[{"param": "p"}]),
        lambda op: op.update(extra=1),
        lambda op: op["argv"].append(["list"]),
        lambda op: op["argv"][1].update(other="x"),
        lambda op: op["argv"][1].update(prefix=5),
        lambda op: op["argv"][1].update(param="q"),
        lambda op: op["params"].update(q={"type": "string", "enum": ["a"]}),
        lambda op: op.update(params={"P": op["params"]["p"]}),
        lambda op: op["params"].update(p="string"),
        lambda op: op["params"]["p"].update(type="number"),
        lambda op: op["params"]["p"].update(format="email"),
        lambda op: op["params"]["p"].update(pattern=5),
        lambda op: op["params"]["p"].update(minLength=-1),
        lambda op: op["params"]["p"].update(maxLength=True),
        lambda op: op["params"].update(p={"type": "integer", "minimum": 1.5}),
        lambda op: op["params"].update(p={"type": "integer", "multipleOf": 0}),
        lambda op: op["params"]["p"].update(enum="a"),
        lambda op: op["params"]["p"].update(minimum=1),  # not a keyword strings take here
    ],
)
def test_a_policy_entry_the_dispatcher_would_not_enforce_exactly_is_refused(change: Any) -> None:
    """Every rule of the policy's shape: a wrong key, type or keyword refuses everything."""
    with pytest.raises(dispatcher.Refused, match="policy_invalid"):
        dispatcher.check_policy(_broken(change))


def test_a_policy_whose_host_or_operations_are_not_what_they_should_be_is_refused() -> None:
    """The document's own fields are checked as strictly as each operation."""
    good = _broken(lambda op: None)
    dispatcher.check_policy(good)
    for key, value in (("host", 5), ("operations", [])):
        body = {k: v for k, v in good.items() if k != "digest"}
        body[key] = value
        with pytest.raises(dispatcher.Refused, match="policy_invalid"):
            dispatcher.check_policy({**body, "digest": policy.digest(body)})
    not_documents: tuple[Any, ...] = (None, [], {"format": policy.POLICY_FORMAT})
    for document in not_documents:
        with pytest.raises(dispatcher.Refused, match="policy_invalid"):
            dispatcher.check_policy(document)


def test_a_pattern_python_cannot_compile_refuses_when_it_is_needed() -> None:
    """Patterns are compiled on use (start-up time): a broken one then refuses everything."""
    doc = _broken(lambda op: op["params"]["p"].update(pattern="("))
    dispatcher.check_policy(doc)
    assert refusal(doc, b"cat --p=abc") == "policy_invalid"


# main(), in this process: everything but running a program (that replaces the process).


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]) -> Any:
    def run(command: str | None, *argv: str) -> tuple[int, bytes, bytes]:
        if command is None:
            monkeypatch.delenv("SSH_ORIGINAL_COMMAND", raising=False)
        else:
            monkeypatch.setenv("SSH_ORIGINAL_COMMAND", command)
        status = dispatcher.main([*policy_owner_args(), *argv])
        out, err = capsysbinary.readouterr()
        return status, out, err

    return run


def test_main_refuses_answers_and_logs_in_process(in_process: Any, tmp_path: Path) -> None:
    """main() for each way a command ends without running anything, and the digest answer."""
    path = str(write_policy(tmp_path / "p.json", POLICIES["local"]))
    log = tmp_path / "log"
    with syslog_listener(log) as listener:
        for command, reason in ((None, "no_command"), ("cat /etc/shadow", "no_match")):
            status, out, err = in_process(command, "--log-socket", str(log), path)
            assert (status, out) == (dispatcher.REFUSED_STATUS, b"")
            assert REFUSAL.fullmatch(err.decode())["reason"] == reason  # type: ignore[index]
        status, out, err = in_process(policy.DIGEST_COMMAND, path)
        assert status == 0 and json.loads(out)["digest"] == POLICIES["local"]["digest"]
        status, _, err = in_process("cat /proc/loadavg")
        assert status == dispatcher.REFUSED_STATUS and b"(bad_invocation)" in err
        lines = read_log(listener)
    assert [line.split("reason=")[1].split()[0] for line in lines] == ["no_command", "no_match"]
    dispatcher.log("lost", dispatcher.LOG_INFO, str(tmp_path / "nobody-listens"))  # no error


def test_main_cuts_a_decision_over_its_cpu_budget(in_process: Any, tmp_path: Path) -> None:
    """The budget in this process: a backtracking pattern is refused as too_costly."""
    doc = _broken(lambda op: op["params"]["p"].update(pattern=translate("^(a|a)*$")))
    path = str(write_policy(tmp_path / "p.json", doc))
    status, _, err = in_process("cat " + shlex.quote("--p=" + "a" * 40 + "!"), path)
    assert status == dispatcher.REFUSED_STATUS and b"(too_costly)" in err


# The file as sshd runs it ----------------------------------------------------------------


@pytest.fixture
def local_policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path / "policy.json", POLICIES["local"])


@contextmanager
def inherited_ignores(*signals: signal.Signals) -> Iterator[None]:
    """This process ignoring ``signals``, as when a shell starts the suite in the background."""
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_an_allowed_command_runs_with_the_fixed_environment(tmp_path: Path) -> None:
    """The program sees PATH, HOME, USER, LOGNAME only; stdin is /dev/null; SIGPIPE is default.

    Whatever the suite inherited: here it ignores SIGQUIT and SIGINT (``./scripts/test &``).
    """
    probe = {
        "environment": ["/usr/bin/env"],
        "stdin": ["/usr/bin/readlink", "/proc/self/fd/0"],
        "signals": ["/bin/grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"],
    }
    doc = sealed({"operations": {k: {"argv": v, "params": {}} for k, v in probe.items()}})
    path = write_policy(tmp_path / "probe.json", doc)
    smuggled = {"LC_EVIL": "$(touch x)", "LANG": "xx", "PYTHONPATH": "/tmp", "LD_PRELOAD": "x"}

    def run(name: str) -> str:
        command = " ".join(shlex.quote(e) for e in probe[name])
        with inherited_ignores(signal.SIGQUIT, signal.SIGINT):
            done = run_dispatcher(path, command, env=smuggled)
        assert done.returncode == 0, done.stderr
        return done.stdout.decode()

    names = sorted(line.split("=", 1)[0] for line in run("environment").splitlines())
    assert names == ["HOME", "LOGNAME", "PATH", "USER"]
    assert f"PATH={dispatcher.FIXED_PATH}" in run("environment")
    assert run("stdin").strip() == "/dev/null"
    masks = dict(line.split(":\t") for line in run("signals").splitlines())
    sigpipe = 1 << (13 - 1)
    assert int(masks["SigIgn"], 16) & sigpipe == 0
    assert int(masks["SigIgn"], 16) == 0 and int(masks["SigBlk"], 16) == 0


def test_a_refusal_exits_77_with_one_line_and_logs_the_digest_only(
    tmp_path: Path, local_policy: Path
) -> None:
    """Refused: status 77, one stderr line, nothing on stdout, a log line without the command."""
    hostile = "cat /proc/loadavg; touch /tmp/sshadapter-must-not-exist"
    with syslog_listener(tmp_path / "log") as log:
        done = run_dispatcher(local_policy, hostile, log_socket=tmp_path / "log")
        lines = read_log(log)
    assert done.returncode == dispatcher.REFUSED_STATUS
    assert done.stdout == b""
    match = REFUSAL.fullmatch(done.stderr.decode())
    assert match is not None and match["reason"] == "not_canonical"
    assert len(lines) == 1
    assert "reason=not_canonical" in lines[0]
    assert f"command_sha256={match['sha']}" in lines[0] and match["sha"] in done.stderr.decode()
    assert "touch" not in lines[0] and "loadavg" not in lines[0]
    assert lines[0].startswith("<84>")  # LOG_AUTHPRIV | LOG_WARNING


def test_an_allowed_command_is_logged_by_operation(tmp_path: Path, local_policy: Path) -> None:
    """Each allowed call leaves one info line naming the operation."""
    with syslog_listener(tmp_path / "log") as log:
        done = run_dispatcher(local_policy, "cat /proc/loadavg", log_socket=tmp_path / "log")
        lines = read_log(log)
    assert done.returncode == 0 and done.stdout.count(b"/") == 1
    assert len(lines) == 1 and "allowed operation=load_average" in lines[0]
    assert lines[0].startswith("<86>")


def test_the_digest_command_is_answered_from_the_policy(local_policy: Path) -> None:
    """The reserved command prints the policy's digest and each operation's, and runs nothing."""
    done = run_dispatcher(local_policy, policy.DIGEST_COMMAND)
    assert done.returncode == 0
    answer = json.loads(done.stdout)
    expected = POLICIES["local"]
    assert answer["digest"] == expected["digest"]
    assert answer["operations"] == policy.operation_digests(expected)
    assert answer["host"] == "local" and answer["format"] == policy.POLICY_FORMAT


def test_a_missing_policy_refuses_everything_even_the_digest(tmp_path: Path) -> None:
    """No policy, no guessing: every command and the digest question are refused."""
    for command in ("cat /proc/loadavg", policy.DIGEST_COMMAND, None):
        done = run_dispatcher(tmp_path / "nope.json", command)
        assert done.returncode == dispatcher.REFUSED_STATUS
        assert b"(policy_unreadable)" in done.stderr


def test_a_program_missing_on_the_host_exits_127(tmp_path: Path) -> None:
    """Allowed, but not installed: the shell's 127, not a refusal."""
    doc = sealed({"operations": {"x": {"argv": ["no-such-program-here"], "params": {}}}})
    done = run_dispatcher(write_policy(tmp_path / "p.json", doc), "no-such-program-here")
    assert done.returncode == dispatcher.NOT_FOUND_STATUS
    assert b"refused" not in done.stderr


def test_a_backtracking_pattern_is_cut_by_the_cpu_budget(tmp_path: Path) -> None:
    """A thief's input that makes Python's re backtrack is refused as too_costly, quickly."""
    op = {
        "argv": ["echo", {"param": "p"}],
        "params": {"p": {"type": "string", "pattern": translate("^(a|a)*$")}},
    }
    path = write_policy(tmp_path / "p.json", sealed({"operations": {"x": op}}))
    started = time.monotonic()
    done = run_dispatcher(path, "echo " + shlex.quote("a" * 60 + "!"))
    assert done.returncode == dispatcher.REFUSED_STATUS
    assert b"(too_costly)" in done.stderr
    assert time.monotonic() - started < 10 * dispatcher.MAX_DECISION_CPU_SECONDS


def test_a_terminal_is_refused(tmp_path: Path, local_policy: Path) -> None:
    """The daemon never asks for a PTY: a session with one (no `restrict`) runs nothing."""
    script = (
        "import os, pty, sys\n"
        "pid, fd = pty.fork()\n"
        "if pid == 0:\n"
        "    os.environ['SSH_ORIGINAL_COMMAND'] = 'cat /proc/loadavg'\n"
        f"    os.execv(sys.executable, [sys.executable, '-IS', {str(DISPATCHER_SOURCE)!r}, "
        f"{str(local_policy)!r}])\n"
        "out = b''\n"
        "while True:\n"
        "    try:\n"
        "        chunk = os.read(fd, 1024)\n"
        "    except OSError:\n"
        "        break\n"
        "    if not chunk:\n"
        "        break\n"
        "    out += chunk\n"
        "print(os.waitpid(pid, 0)[1] >> 8, out.decode())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    status, _, text = done.stdout.partition(" ")
    assert int(status) == dispatcher.REFUSED_STATUS and "(terminal)" in text


def test_a_wrong_forced_command_refuses_everything(tmp_path: Path, local_policy: Path) -> None:
    """No policy argument, or too many: the operator's mistake runs nothing."""
    for argv in ([], [str(local_policy), "extra"]):
        done = subprocess.run(
            [sys.executable, "-IS", str(DISPATCHER_SOURCE), *argv],
            env={"SSH_ORIGINAL_COMMAND": "cat /proc/loadavg"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        assert done.returncode == dispatcher.REFUSED_STATUS and b"(bad_invocation)" in done.stderr


# The file runs on the hosts' Pythons, with the standard library only ---------------------


def _pythons() -> list[str]:
    """This interpreter and any other 3.9+ found here (pyenv, PATH)."""
    found = {os.path.realpath(sys.executable): sys.executable}
    candidates = [shutil.which(f"python3.{minor}") for minor in range(9, 14)]
    candidates += [str(p) for p in (Path.home() / ".pyenv/versions").glob("3.*/bin/python3")]
    candidates.append("/usr/bin/python3")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            version = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info >= (3, 9))"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if version.stdout.strip() == "True":
                found.setdefault(os.path.realpath(candidate), candidate)
    return sorted(found.values())


@pytest.mark.parametrize("python", _pythons())
def test_the_dispatcher_runs_on_each_python_here(python: str, local_policy: Path) -> None:
    """Allowed, refused and digest answers are the same on every Python 3.9+ on this machine."""
    allowed = run_dispatcher(local_policy, "cat /proc/loadavg", python=python)
    assert allowed.returncode == 0 and allowed.stdout.count(b" ") == 4
    refused = run_dispatcher(local_policy, "cat /etc/shadow", python=python)
    assert refused.returncode == 77 and b"(no_match)" in refused.stderr
    answer = run_dispatcher(local_policy, policy.DIGEST_COMMAND, python=python)
    assert json.loads(answer.stdout)["digest"] == POLICIES["local"]["digest"]


def _vermin(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from vermin.main import main; sys.exit(main())",
            *("--no-tips", "--violations", "-t=3.9-", str(path)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_dispatcher_needs_nothing_newer_than_python_3_9(tmp_path: Path) -> None:
    """vermin finds no feature of Python 3.10 or later (and does find one when there is)."""
    written = tmp_path / "sshadapter-dispatch.py"  # the launcher, with the dispatcher in it
    written.write_bytes(policy.dispatcher_source())
    for path in (DISPATCHER_SOURCE, written):
        ast.parse(path.read_text(), feature_version=(3, 9))
        done = _vermin(path)
        assert done.returncode == 0, done.stdout + done.stderr
    newer = tmp_path / "newer.py"
    newer.write_text("def f(a, b):\n    return list(zip(a, b, strict=True))\n")
    assert _vermin(newer).returncode != 0  # the check can fail


def test_the_dispatcher_imports_only_the_standard_library_and_nobody_imports_it() -> None:
    """Stdlib only on the host; no module of the daemon imports the host's file."""
    tree = ast.parse(DISPATCHER_SOURCE.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    # _sha2 is the builtin sha256 of Python 3.12 and later (this may be an older Python)
    assert imported <= sys.stdlib_module_names | {"_sha2"}, imported
    assert DISPATCHER_SOURCE.read_text().startswith("#!/usr/bin/python3 -IS\n")
    for path in (ROOT / "sshadapter").rglob("*.py"):
        if path == DISPATCHER_SOURCE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n.endswith("dispatcher") for n in names), path


# The generator: what a dispatch host's operation may not do ------------------------------

BASE = SYNTHETIC.replace('"{project}"]', '"x"]')
assert BASE != SYNTHETIC


@pytest.mark.parametrize(
    ("change", "key", "phrase"),
    [
        (
            ("[output]", '[output]\nexit_codes = { 0 = "success", 77 = "NOT_FOUND" }'),
            "output.exit_codes.77",
            "refusal status",
        ),
        (('"n={count}."', '"{count}{flag}"'), "argv[4]", "at most one placeholder"),
        (('"/usr/bin/printf"', '"{project}"'), "argv[0]", "literal name or absolute path"),
        (('"/usr/bin/printf"', '"bin/printf"'), "argv[0]", "literal name or absolute path"),
        (('"/usr/bin/printf"', '"-x"'), "argv[0]", "literal name or absolute path"),
        (("'^[a-z0-9-]{1,20}$'", "'^\\p{L}+$'"), "params.project.pattern", "\\p"),
        (("'^[a-z0-9-]{1,20}$'", "'^a\\b'"), "params.project.pattern", "\\b"),
        (("'^[a-z0-9-]{1,20}$'", "'^(?i)a$'"), "params.project.pattern", "flag"),
        (("multipleOf = 5", "multipleOf = 0.5"), "params.count.multipleOf", "whole number"),
        (("minimum = -5", "minimum = 2000"), "params.count", "no integer"),
        (
            ("pattern = '^[a-z0-9-]{1,20}$'", "pattern = '^[a-z0-9-]{1,20}$'\nformat = \"email\""),
            "params.project.format",
            "date-time",
        ),
    ],
)
def test_an_operation_the_dispatcher_could_not_enforce_does_not_load(
    tmp_path: Path, change: tuple[str, str], key: str, phrase: str
) -> None:
    """On a dispatch host these are load errors naming file and key; elsewhere they load."""
    text = BASE.replace(*change, 1)
    assert text != BASE
    with pytest.raises(ConfigError) as info:
        synthetic_registry(tmp_path, text)
    assert (info.value.key, Path(info.value.file).name) == (key, "synthetic.toml")
    assert phrase in info.value.reason
    if key != "argv[0]" or "{" not in change[1]:
        commands = tmp_path / "commands"
        load_registry(commands, ROOT / "schemas", hosts=("h",))  # not a dispatch host: loads


def test_two_operations_one_command_could_match_do_not_load(tmp_path: Path) -> None:
    """`cat /proc/loadavg` and `cat {path}` with a path pattern that admits it: ambiguous."""
    one = (
        (ROOT / "commands" / "load_average.toml")
        .read_text()
        .replace('host = "local"', 'host = "h"')
    )
    two = one.replace('argv = ["cat", "/proc/loadavg"]', 'argv = ["cat", "{path}"]').replace(
        "[output]", "[params.path]\ntype = \"string\"\npattern = '^/proc/[a-z]+$'\n\n[output]"
    )
    commands = tmp_path / "commands"
    commands.mkdir()
    (commands / "one.toml").write_text(one)
    (commands / "two.toml").write_text(two)
    with pytest.raises(ConfigError) as info:
        policy.host_policies(
            load_registry(commands, ROOT / "schemas", hosts=("h",), dispatch_hosts=("h",))
        )
    assert "one and two could both match" in info.value.reason
    (commands / "two.toml").write_text(two.replace("^/proc/[a-z]+$", "^/sys/[a-z]+$"))
    policy.host_policies(
        load_registry(commands, ROOT / "schemas", hosts=("h",), dispatch_hosts=("h",))
    )


def test_the_policy_holds_templates_and_parameters_and_nothing_else() -> None:
    """Per operation argv and params; no output schema, no other host, no version or secret."""
    ci = POLICIES["ci"]
    assert set(ci) == {"format", "host", "operations", "digest"}
    assert sorted(ci["operations"]) == ["deploy_status", "job_run_status", "review_status"]
    for entry in ci["operations"].values():
        assert set(entry) == {"argv", "params"}
    job = ci["operations"]["job_run_status"]
    assert job["argv"] == [
        "ci-cli",
        "run",
        "status",
        "--json",
        "--project",
        {"param": "project_id"},
    ]
    assert job["params"] == {
        "project_id": {
            "type": "string",
            "pattern": "\\A[a-z0-9][a-z0-9\\-]{2,62}\\Z",
            "maxLength": 63,
        }
    }
    body = {k: v for k, v in ci.items() if k != "digest"}
    assert ci["digest"] == policy.digest(body) == dispatcher.digest(body)


# The command line --------------------------------------------------------------------------


def write_config(tmp_path: Path, *, dispatch: tuple[str, ...] = ("ci",)) -> Path:
    hosts = "".join(
        f'[hosts.{alias}]\naddress = "127.0.0.1"\nuser = "x"\nknown_hosts = "/dev/null"\n'
        f"dispatch = {'true' if alias in dispatch else 'false'}\n\n"
        for alias in ("ci", "local")
    )
    config = tmp_path / "config.toml"
    config.write_text(
        f'[paths]\ncommands = "{ROOT / "commands"}"\nschemas = "{ROOT / "schemas"}"\n\n{hosts}'
    )
    return config


def test_sshadapter_policy_prints_one_hosts_policy(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """`sshadapter policy ALIAS` prints what the daemon expects, dispatch host or not yet."""
    config = write_config(tmp_path)
    for alias in ("ci", "local"):  # local is not marked yet: the policy comes first
        assert cli_main(["policy", alias, "--config", str(config)]) == 0
        printed = json.loads(capsysbinary.readouterr().out)
        assert printed == POLICIES[alias]
    assert cli_main(["policy", "web1", "--config", str(config)]) == 2


def test_sshadapter_dispatcher_writes_the_file_0755(tmp_path: Path) -> None:
    """`sshadapter dispatcher --write PATH`: the exact file, executable, also over an old one."""
    target = tmp_path / "sshadapter-dispatch"
    target.write_text("old")
    target.chmod(0o600)
    assert cli_main(["dispatcher", "--write", str(target)]) == 0
    assert target.read_bytes() == policy.dispatcher_source()
    assert target.stat().st_mode & 0o777 == 0o755
    assert cli_main(["dispatcher", "--write", str(tmp_path / "no" / "dir")]) == 2


def test_sshadapter_dispatcher_replaces_a_planted_link_and_refuses_a_shared_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hard link at PATH is replaced, its file unchanged; a shared directory: one line, exit 2."""
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    target = tmp_path / "sshadapter-dispatch"
    os.link(secret, target)
    assert cli_main(["dispatcher", "--write", str(target)]) == 0
    assert target.read_bytes() == policy.dispatcher_source()
    assert secret.read_text() == "root only\n" and secret.stat().st_mode & 0o777 == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    capsys.readouterr()
    assert cli_main(["dispatcher", "--write", str(shared / "sshadapter-dispatch")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sshadapter: {shared}: --write: directory mode 0777 lets ")
    assert err.count("\n") == 1 and list(shared.iterdir()) == []


def test_an_allowed_call_imports_no_json_re_enum_or_os(tmp_path: Path) -> None:
    """An allowed call and the digest answer import only builtin and C modules (start-up)."""
    local_policy = write_policy(
        tmp_path / "p.json", policy.host_policies(shipped_registry())["local"]
    )
    bare = modules_imported(["-c", "pass"], "")
    run = [str(DISPATCHER_SOURCE), *policy_owner_args(), "--log-socket", str(tmp_path / "log")]
    for command in ("cat /proc/loadavg", policy.DIGEST_COMMAND):
        names = modules_imported([*run, str(local_policy)], command)
        assert "_json" in names  # the check sees the dispatcher's imports
        extra = names - bare
        assert extra <= {"_signal", "_socket", "_stat", "pwd", "_sha256", "_sha2", "_json"}, extra


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
@settings(max_examples=300, deadline=None)
def test_the_c_json_halves_read_and_write_as_json_does(value: Any) -> None:
    """The dispatcher's canonical JSON and parser, without the json package, agree with json."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert dispatcher.canonical_json(value) == text.encode()
    assert dispatcher.loads(f" {json.dumps(value, indent=1)}\n") == value


@pytest.mark.parametrize(
    "text",
    ["", " ", "[1] x", "[1,]", "NaN", "[Infinity]", '{"a":1,"a":2}', "\ufeff{}", "{'a':1}", "[1"],
)
def test_the_dispatcher_refuses_what_is_not_one_json_value(text: str) -> None:
    """Empty, trailing data, NaN, duplicate keys, a BOM or a cut value are not a policy."""
    with pytest.raises((ValueError, dispatcher.Refused)):
        dispatcher.loads(text)
