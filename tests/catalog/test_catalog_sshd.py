"""Every catalog operation, discovered from sshadapter/catalog/, run by `sshadapter serve`
against this machine's own commands through a real sshd: each answers with a success, or,
where it needs a running systemd and this machine has none, with its documented failure,
or, where its program is not installed here (dnf on Debian), with a closed failure.

The arguments of each call are those of its first accepted fixture (a listed parameter
takes the configuration's value), on host `local`. The actions change things: they are
proved through approval and refusal in test_catalog.py, and named here so that none is
left out silently. A SIGHUP then rereads `[catalog]`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
from sshd import Sshd, running_sshd
from test_integration import cli, notifications
from test_integration import write_config as integration_config

from sshadapter.catalog import LISTED_PARAMETERS, catalog_operation_files, listed_parameters
from sshadapter.check.catalog_doc import SYSTEMD_PROGRAMS, program
from sshadapter.contract.commandfile import CommandFile, parse_command_file, read_command_bytes
from sshadapter.sections import MUTATING_FAMILY

ROOT: Final = Path(__file__).resolve().parents[2]
# Where systemd, as PID 1, says it runs (sd_booted(3)): absent in this container.
SYSTEMD_RUNNING: Final = Path("/run/systemd/system").is_dir()
# What a host answers when the program is missing (the shell's 127, or a dispatcher's refusal).
CLOSED_FAILURES: Final = {"INVALID_RESPONSE", "UPSTREAM_UNAVAILABLE", "NOT_FOUND"}
# Where the actions are proved instead (they change the host).
ACTIONS_TEST: Final = (
    "test_catalog.py::test_an_action_runs_only_approved_on_one_host_for_a_listed_unit"
)


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    with running_sshd() as server:
        yield server


def certificate(directory: Path) -> Path:
    """A self-signed certificate the login account can read (sshd's workdir is 0755)."""
    path = directory / "catalog-test.pem"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ),
            *("-nodes", "-keyout", str(directory / "catalog-test.key"), "-out", str(path)),
            *("-days", "30", "-subj", "/CN=catalog.test"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    path.chmod(0o644)
    return path


def write_config(directory: Path, sshd: Sshd, certificate_path: Path, exclude: str) -> Path:
    """test_integration's configuration (host `local` on the test sshd) with `[catalog]
    families = ["all"]`; ``exclude``: a TOML list of maintenance operations left out."""
    config = directory / "config.toml"
    if not config.exists():
        integration_config(directory, sshd)
        config.write_text(config.read_text() + "\n[catalog]\n")
    shared, _, _ = config.read_text().partition("\n[catalog]\n")
    config.write_text(f"""{shared}
[catalog]
families = ["all"]

[catalog.maintenance]
certificate_paths = ["{certificate_path}"]
exclude = {exclude}
""")
    return config


def first_accepted_args(path: Path) -> dict[str, Any]:
    """The `args` of the operation's first accepted fixture."""
    for case in sorted(path.with_name(f"{path.stem}.fixtures").glob("*.case.json")):
        spec = json.loads(case.read_text())
        if spec["expect"]["outcome"] == "success":
            return dict(spec.get("args", {}))
    raise AssertionError(f"{path.stem}: no accepted fixture")


def call_words(path: Path, listed: Mapping[str, str]) -> list[str]:
    """`sshadapter call` arguments for the operation on `local`."""
    args = first_accepted_args(path)
    for name in listed_parameters(path):
        if name in args:
            args[name] = listed[LISTED_PARAMETERS[(path.parent.name, name)]]
    words = [f"{k}={v}" if isinstance(v, str) else f"{k}:={json.dumps(v)}" for k, v in args.items()]
    return [*words, "run_on=local"]


def needs_systemd(spec: CommandFile) -> bool:
    return program(spec.argv) in SYSTEMD_PROGRAMS


def installed_here(spec: CommandFile) -> bool:
    """Whether this machine has the operation's program (dnf is RHEL's, apt Debian's)."""
    return shutil.which(program(spec.argv)) is not None


def documented_failures(spec: CommandFile) -> set[str]:
    """What the command file says exit status 1 means (a bus client's answer without systemd)."""
    entry = spec.output.exit_codes.get("1")
    if entry is None:
        return set()
    return {entry} if isinstance(entry, str) else {entry.then, entry.otherwise}


def test_every_catalog_operation_answers_from_this_machine_through_sshd(
    sshd: Sshd, tmp_path: Path
) -> None:
    """Each read-only catalog operation answers from this machine through sshd; SIGHUP rereads.

    A success on this machine's real commands, or the documented failure where it needs a
    systemd that is not running; then a SIGHUP rereads [catalog] and the operation it
    excludes is gone from `list`."""
    cert = certificate(sshd.workdir)
    config = write_config(tmp_path, sshd, cert, "[]")
    listed = {"certificate_paths": str(cert)}
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    log = (tmp_path / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")},
        stderr=log,
    )
    sock = str(tmp_path / "sshadapter.sock")
    ran, without_systemd, not_installed, elsewhere = [], [], [], []
    try:
        assert "READY=1" in notifications(notify, "READY=1")
        for path in catalog_operation_files():
            spec = parse_command_file(path, read_command_bytes(path))
            if path.parent.name == MUTATING_FAMILY:
                elsewhere.append(path.stem)  # changes the host: proved in ACTIONS_TEST
                continue
            done = cli("call", path.stem, *call_words(path, listed), "--socket", sock)
            envelope = json.loads(done.stdout)
            assert envelope["outcome"] in ("success", "failure"), (path.stem, envelope)
            # A call on one host of a fan-out operation answers with that host's entry.
            results = envelope.get("data", {}).get("results") or [envelope]
            [result] = results
            if not installed_here(spec):  # another distribution's tool: a closed failure
                assert result["outcome"] == "failure", (path.stem, envelope)
                assert result["error"]["code"] in CLOSED_FAILURES, (path.stem, envelope)
                not_installed.append(path.stem)
                continue
            if needs_systemd(spec) and not SYSTEMD_RUNNING:
                code = result.get("error", {}).get("code")
                assert code in documented_failures(spec), (path.stem, envelope)
                without_systemd.append(path.stem)
                continue
            assert done.returncode == 0, (path.stem, done.stdout, done.stderr)
            assert result["outcome"] == "success", (path.stem, result)
            ran.append(path.stem)
        print(  # the test says which answered, and which gave their failure without systemd
            f"succeeded: {ran}; documented failure without a running systemd: "
            f"{without_systemd}; program not installed here: {not_installed}; "
            f"actions, proved in {ACTIONS_TEST}: {elsewhere}"
        )
        assert sorted(ran + without_systemd + not_installed + elsewhere) == sorted(
            p.stem for p in catalog_operation_files()
        )
        assert "cert_expiry" in ran

        write_config(tmp_path, sshd, cert, '["cert_expiry"]')
        daemon.send_signal(signal.SIGHUP)
        assert notifications(notify, "READY=1")[0] == "RELOADING=1"
        listing = cli("list", "--socket", sock)
        names = {tool["name"] for tool in json.loads(listing.stdout)["tools"]}
        assert "cert_expiry" not in names
        assert set(ran) - {"cert_expiry"} <= names

        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
    except BaseException:
        log.flush()
        print((tmp_path / "daemon.log").read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()
        notify.close()
        log.close()
