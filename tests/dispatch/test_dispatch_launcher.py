"""The written sshadapter-dispatch: its launcher runs code compiled ahead only when trusted.

Reference: docs/dispatcher.md "Start-up". The file `sshadapter dispatcher --write`
writes is the launcher (sshadapter/dispatch/launcher.py) with the dispatcher's source
in it; `PATH --compile` writes PATH.compiled. A call runs that code only when it is
root's (or --policy-owner's) as the policy must be, and made from the same source by
the same interpreter; anything else compiles the source, which decides the same.
"""

from __future__ import annotations

import ast
import marshal
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dispatch_support import (
    DISPATCHER_SOURCE,
    host_python,
    install_dispatcher,
    modules_imported,
    shipped_registry,
    write_policy,
)
from sshd import host_directory, policy_owner_args

from sshadapter.cli import main as cli_main
from sshadapter.dispatch import dispatcher, launcher, policy

# A stand-in the launcher would run instead of the dispatcher: it shows which code ran.
MARKER_CODE = "import sys\nsys.stdout.write('ran the compiled file\\n')\n"
MARKER = b"ran the compiled file\n"


def _source_of(written: Path) -> str:
    """The ``SOURCE`` literal of a written file."""
    for node in ast.parse(written.read_text()).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "SOURCE":
            value = ast.literal_eval(node.value)
            assert isinstance(value, str)
            return value
    raise AssertionError("no SOURCE")


def _call(
    dispatch: Path, policy_file: Path, command: str, *, python: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    """The written file as sshd runs it: by its first line, with the client's command."""
    argv = [python or host_python(), "-IS", str(dispatch), *policy_owner_args()]
    return subprocess.run(
        [*argv, "--log-socket", str(dispatch.parent / "log"), str(policy_file)],
        env={"PATH": "/usr/bin:/bin", "HOME": "/", "SSH_ORIGINAL_COMMAND": command},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )


def _marker_cache(dispatch: Path, *, header: bytes | None = None) -> Path:
    """PATH.compiled holding MARKER_CODE, under the header of the written file's own source."""
    source = _source_of(dispatch)
    code = compile(MARKER_CODE, "marker", "exec")
    cache = Path(str(dispatch) + launcher.CODE_SUFFIX)
    cache.write_bytes((header or launcher.header(source)) + marshal.dumps(code))
    cache.chmod(0o644)
    return cache


@pytest.fixture
def host() -> Iterator[Path]:
    """A directory the dispatcher trusts (root's, or this uid's with --policy-owner)."""
    with host_directory() as directory:
        yield directory


@pytest.fixture
def local_policy(host: Path) -> Path:
    return write_policy(host / "policy.json", policy.host_policies(shipped_registry())["local"])


def test_the_written_file_is_the_launcher_with_the_dispatchers_source(tmp_path: Path) -> None:
    """`dispatcher --write`: the launcher, first line intact, the dispatcher's source exactly."""
    target = tmp_path / "sshadapter-dispatch"
    assert cli_main(["dispatcher", "--write", str(target)]) == 0
    text = target.read_text()
    assert text.startswith("#!/usr/bin/python3 -IS\n")
    assert _source_of(target) == DISPATCHER_SOURCE.read_text()
    assert ast.parse(text, feature_version=(3, 9))


def test_compile_writes_the_code_and_calls_run_it(host: Path, local_policy: Path) -> None:
    """`PATH --compile` writes PATH.compiled (0644); allowed, refused and digest calls all work."""
    dispatch = install_dispatcher(host)
    cache = Path(str(dispatch) + launcher.CODE_SUFFIX)
    assert cache.stat().st_mode & 0o777 == 0o644
    assert cache.read_bytes().startswith(launcher.header(_source_of(dispatch)))
    assert _call(dispatch, local_policy, "cat /proc/loadavg").returncode == 0
    refused = _call(dispatch, local_policy, "cat /etc/shadow")
    assert refused.returncode == dispatcher.REFUSED_STATUS, refused.stderr
    answer = _call(dispatch, local_policy, policy.DIGEST_COMMAND)
    assert answer.returncode == 0
    assert b'"digest":"' + local_policy.read_text().split('"digest": "')[1][:71].encode() in (
        answer.stdout
    )


def test_a_trusted_current_compiled_file_is_what_runs(host: Path, local_policy: Path) -> None:
    """The code in PATH.compiled runs when its header matches: the cache is really used."""
    dispatch = install_dispatcher(host, compiled=False)
    _marker_cache(dispatch)
    assert _call(dispatch, local_policy, "cat /proc/loadavg").stdout == MARKER


def test_without_a_compiled_file_the_source_runs(host: Path, local_policy: Path) -> None:
    """No PATH.compiled: the launcher compiles its source, and the call is judged the same."""
    dispatch = install_dispatcher(host, compiled=False)
    assert _call(dispatch, local_policy, "cat /proc/loadavg").returncode == 0
    refused = _call(dispatch, local_policy, "cat /etc/shadow")
    assert refused.returncode == dispatcher.REFUSED_STATUS


@pytest.mark.parametrize(
    "header",
    [
        b"sshadapter-dispatch-code/1 00000000 cpython-311 sha256:",  # another magic number
        b"sshadapter-dispatch-code/0 ",  # another format
        b"",  # nothing
    ],
)
def test_a_stale_compiled_file_is_never_run(host: Path, local_policy: Path, header: bytes) -> None:
    """Another interpreter's magic, another format or no header: the source runs instead."""
    dispatch = install_dispatcher(host, compiled=False)
    _marker_cache(dispatch, header=header + b"\n")
    done = _call(dispatch, local_policy, "cat /proc/loadavg")
    assert done.returncode == 0 and MARKER not in done.stdout


def test_a_compiled_file_of_another_source_is_never_run(host: Path, local_policy: Path) -> None:
    """Code compiled from another dispatcher's source (an older version) is ignored."""
    dispatch = install_dispatcher(host, compiled=False)
    _marker_cache(dispatch, header=launcher.header(_source_of(dispatch) + "# older\n"))
    done = _call(dispatch, local_policy, "cat /proc/loadavg")
    assert done.returncode == 0 and MARKER not in done.stdout


def test_an_unsafe_compiled_file_is_never_run(host: Path, local_policy: Path) -> None:
    """Group-writable, a symbolic link, or in a group-writable directory: the source runs."""
    dispatch = install_dispatcher(host, compiled=False)
    cache = _marker_cache(dispatch)
    cache.chmod(0o664)
    assert MARKER not in _call(dispatch, local_policy, "cat /proc/loadavg").stdout
    cache.chmod(0o644)
    elsewhere = host / "elsewhere"
    cache.rename(elsewhere)
    cache.symlink_to(elsewhere)
    assert MARKER not in _call(dispatch, local_policy, "cat /proc/loadavg").stdout
    cache.unlink()
    (host / "sub").mkdir(mode=0o755)
    moved = install_dispatcher(host / "sub", compiled=False)
    _marker_cache(moved)
    (host / "sub").chmod(0o775)
    done = _call(moved, local_policy, "cat /proc/loadavg")
    assert MARKER not in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another owner")
def test_a_compiled_file_someone_else_owns_is_never_run(host: Path, local_policy: Path) -> None:
    """A compiled file owned by neither root nor --policy-owner is not run."""
    dispatch = install_dispatcher(host, compiled=False)
    os.chown(_marker_cache(dispatch), 65534, 65534)
    done = _call(dispatch, local_policy, "cat /proc/loadavg")
    assert done.returncode == 0 and MARKER not in done.stdout


@pytest.mark.parametrize("junk", [b"\x00\x01", b"\xff" * 64, marshal.dumps("print(1)")])
def test_a_malformed_compiled_file_is_never_run(
    host: Path, local_policy: Path, junk: bytes
) -> None:
    """Bytes that are no code object after a good header: the source runs, no traceback."""
    dispatch = install_dispatcher(host, compiled=False)
    cache = Path(str(dispatch) + launcher.CODE_SUFFIX)
    cache.write_bytes(launcher.header(_source_of(dispatch)) + junk)
    done = _call(dispatch, local_policy, "cat /proc/loadavg")
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr


def test_compile_refuses_a_relative_path_and_an_unsafe_place(tmp_path: Path, host: Path) -> None:
    """--compile by a relative path, or where calls would not trust it: 126 and the reason."""
    dispatch = install_dispatcher(host, compiled=False)
    relative = subprocess.run(
        [host_python(), "-IS", dispatch.name, "--compile"],
        cwd=host,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert relative.returncode == dispatcher.CANNOT_EXECUTE_STATUS
    assert b"absolute path" in relative.stderr
    tmp_path.chmod(0o777)  # anyone may write here: calls will not use it
    unsafe = install_dispatcher(tmp_path, compiled=False)
    done = subprocess.run(
        [host_python(), "-IS", str(unsafe), "--compile"], capture_output=True, check=False
    )
    assert done.returncode == dispatcher.CANNOT_EXECUTE_STATUS
    assert b"calls will not use it" in done.stderr
    Path(str(dispatch) + launcher.CODE_SUFFIX).mkdir()  # cannot be replaced by a file
    failed = subprocess.run(
        [host_python(), "-IS", str(dispatch), "--compile"], capture_output=True, check=False
    )
    assert failed.returncode == dispatcher.CANNOT_EXECUTE_STATUS, failed.stderr


def test_the_unwritten_launcher_runs_nothing(tmp_path: Path) -> None:
    """launcher.py itself, without a dispatcher in it, exits 126 and says so."""
    done = subprocess.run(
        [sys.executable, "-IS", launcher.__file__, "/etc/policy.json"],
        capture_output=True,
        check=False,
    )
    assert done.returncode == launcher.CANNOT_EXECUTE_STATUS
    assert b"no dispatcher in this file" in done.stderr


def test_the_compiled_allowed_path_imports_only_builtin_and_c_modules(
    host: Path, local_policy: Path
) -> None:
    """Through the written, compiled file an allowed call adds only _json, _socket and builtins."""

    dispatch = host / "sshadapter-dispatch"
    dispatch.write_bytes(policy.dispatcher_source())
    compiled = subprocess.run(
        [sys.executable, "-IS", str(dispatch), "--compile"], capture_output=True, check=False
    )
    assert compiled.returncode == 0, compiled.stderr
    bare = modules_imported(["-c", "pass"], "")
    run = [str(dispatch), *policy_owner_args(), "--log-socket", str(host / "log")]
    names = modules_imported([*run, str(local_policy)], "cat /proc/loadavg")
    assert "_json" in names
    extra = names - bare
    allowed = {"_signal", "_socket", "_stat", "pwd", "_sha256", "_sha2", "_json", "marshal"}
    assert extra <= allowed, extra


@pytest.mark.parametrize(
    ("args", "owners"),
    [
        ([], {0}),
        (["/p.json"], {0}),
        (["--policy-owner", "1000", "/p.json"], {0, 1000}),
        (["--log-socket", "/l", "--policy-owner", "7", "/p.json"], {0, 7}),
        (["--policy-owner", "x1", "/p.json"], {0}),
        (["--policy-owner", "1", "--policy-owner", "2", "/p.json"], {0, 1}),
        (["/p.json", "--policy-owner", "3"], {0}),
    ],
)
def test_the_launcher_reads_the_owner_as_the_dispatcher_does(
    args: list[str], owners: set[int]
) -> None:
    """--policy-owner counts for the compiled file as for the policy: leading, once, digits."""
    assert launcher.owners(args) == owners
    options, _ = dispatcher._options(args)
    expected = options.get("--policy-owner", "0")
    if expected.isdigit():
        assert int(expected) in owners


def test_the_launcher_walk_trusts_what_the_policy_walk_trusts(host: Path, tmp_path: Path) -> None:
    """read_trusted and read_policy_bytes accept and refuse the same files."""
    owner = os.getuid()
    good = host / "good"
    good.write_bytes(b"{}")
    good.chmod(0o644)
    loose = host / "loose"
    loose.write_bytes(b"{}")
    loose.chmod(0o664)
    link = host / "link"
    link.symlink_to(good)
    fifo = host / "fifo"
    os.mkfifo(fifo, 0o644)
    tmp_path.chmod(0o777)
    open_dir = tmp_path / "file"
    open_dir.write_bytes(b"{}")
    cases = [good, loose, link, fifo, host / "missing", open_dir, Path("relative"), host]
    for path in cases:
        try:
            dispatcher.read_policy_bytes(str(path), owner)
            policy_ok = True
        except dispatcher.Refused:
            policy_ok = False
        assert (launcher.read_trusted(str(path), {0, owner}) is not None) == policy_ok, path
    big = host / "big"
    big.write_bytes(b" " * (launcher.MAX_CODE_BYTES + 1))
    big.chmod(0o644)
    assert launcher.read_trusted(str(big), {0, owner}) is None


def test_compiled_returns_code_only_when_every_condition_holds(host: Path) -> None:
    """In-process: trusted, current and a code object gives code; any failure gives None."""
    source = DISPATCHER_SOURCE.read_text()
    script = str(host / "sshadapter-dispatch")
    allowed = launcher.owners(policy_owner_args())
    assert launcher.compiled(script, source, allowed) is None  # no file
    cache = Path(script + launcher.CODE_SUFFIX)
    code = compile(MARKER_CODE, "marker", "exec")
    cache.write_bytes(launcher.header(source) + marshal.dumps(code))
    cache.chmod(0o644)
    assert launcher.compiled(script, source, allowed) == code
    assert launcher.compiled(script, source + "\n", allowed) is None  # another source
    cache.write_bytes(launcher.header(source) + b"\xff")
    assert launcher.compiled(script, source, allowed) is None  # not marshal
    cache.write_bytes(launcher.header(source) + marshal.dumps(["not", "code"]))
    assert launcher.compiled(script, source, allowed) is None  # not a code object


def test_write_compiled_writes_atomically_and_says_whether_calls_use_it(
    host: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process: written 0644 and usable (0); relative, unsafe or unwritable: 126."""
    source = DISPATCHER_SOURCE.read_text()
    data = launcher.header(source) + marshal.dumps(compile(source, "x", "exec"))
    target = str(host / "sshadapter-dispatch") + launcher.CODE_SUFFIX
    assert dispatcher.write_compiled(target, data, launcher.compiled, source) == 0
    assert Path(target).read_bytes() == data
    assert Path(target).stat().st_mode & 0o777 == 0o644
    assert "compiled for" in capsys.readouterr().err
    relative = "sshadapter-dispatch" + launcher.CODE_SUFFIX
    assert dispatcher.write_compiled(relative, data, launcher.compiled, source) == 126
    assert "absolute path" in capsys.readouterr().err
    tmp_path.chmod(0o777)
    unsafe = str(tmp_path / "sshadapter-dispatch") + launcher.CODE_SUFFIX
    assert dispatcher.write_compiled(unsafe, data, launcher.compiled, source) == 126
    assert "calls will not use it" in capsys.readouterr().err
    missing = str(host / "no" / "sshadapter-dispatch") + launcher.CODE_SUFFIX
    assert dispatcher.write_compiled(missing, data, launcher.compiled, source) == 126
    assert "No such file" in capsys.readouterr().err


def test_the_launcher_main_compiles_and_runs_in_process(
    host: Path, local_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main: no source exits 126; --compile writes the file; a call then runs from it."""
    source = DISPATCHER_SOURCE.read_text()
    script = str(host / "sshadapter-dispatch")
    with pytest.raises(SystemExit) as empty:
        launcher.main("")
    assert empty.value.code == launcher.CANNOT_EXECUTE_STATUS
    monkeypatch.setattr(sys, "argv", [script, launcher.COMPILE_OPTION])
    with pytest.raises(SystemExit) as compiling:
        launcher.main(source)
    assert compiling.value.code == 0
    assert launcher.compiled(script, source, launcher.owners(policy_owner_args())) is not None
    args = [*policy_owner_args(), "--log-socket", str(host / "log"), str(local_policy)]
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as judged:  # run from the compiled code; nothing execs
        launcher.main(source)  # this process's start-up environment has no command: 77
    assert judged.value.code == dispatcher.REFUSED_STATUS
