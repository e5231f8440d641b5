"""Run a real Daemon on a Unix socket in tmp_path, in-process, with any Runner."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from sshadapter.audit.writer import FsyncPolicy
from sshadapter.config import (
    ApprovalsSection,
    AuditSection,
    Config,
    Grant,
    GroupSection,
    HostSection,
    PathsSection,
    PoolSection,
    ServerSection,
)
from sshadapter.daemon.assemble import assemble
from sshadapter.daemon.offload import Judge
from sshadapter.daemon.server import Daemon
from sshadapter.daemon.service import Service
from sshadapter.daemon.unix_socket import bind_socket
from sshadapter.runners.interface import Runner, RunResult
from sshadapter.runners.scripted import ScriptedRunner
from sshadapter.sections import Allow, CatalogSection

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 30, 4, 12, tzinfo=UTC)
JOB_OUT = {
    "project_id": "bluebird",
    "run_id": "run_8fK2mQ9xLp3a",
    "state": "failed",
    "observed_at": "2026-11-30T04:10:00Z",
    "url": "https://ci.example.invalid/r/1",
    "log_tail": "ok",
}
JOB_COMMAND = "ci-cli run status --json --project bluebird"


def job_runner() -> ScriptedRunner:
    return ScriptedRunner({JOB_COMMAND: RunResult(orjson.dumps(JOB_OUT), b"", 0)})


@dataclass
class Running:
    path: Path
    daemon: Daemon
    service: Service
    audit_path: Path

    async def ask(self, message: Mapping[str, Any] | bytes) -> Any:
        """One request on a fresh connection."""
        reader, writer = await asyncio.open_unix_connection(str(self.path), limit=32 << 20)
        try:
            line = message if isinstance(message, bytes) else orjson.dumps(message) + b"\n"
            writer.write(line)
            await writer.drain()
            return orjson.loads(await reader.readline())
        finally:
            writer.close()

    def audit_records(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.audit_path.read_bytes().splitlines()]


def shipped_commands(tmp_path: Path) -> Path:
    """The shipped commands, with job_run_status also allowing this test's uid."""
    commands = tmp_path / "commands"
    commands.mkdir(parents=True, exist_ok=True)
    for path in (ROOT / "commands").glob("*.toml"):
        text = path.read_text()
        if path.stem == "job_run_status":
            text = text.replace(
                'allow = { groups = ["sshadapter-agents"] }',
                f'allow = {{ groups = ["sshadapter-agents"], uids = [{os.getuid()}] }}',
            )
        (commands / path.name).write_text(text)
    return commands


def with_daemon(
    tmp_path: Path,
    body: Callable[[Running], Awaitable[None]],
    *,
    runner: Runner | None = None,
    allow: Allow | None = None,
    commands: Path | None = None,
    schemas: Path = ROOT / "schemas",
    hosts: Mapping[str, HostSection] | None = None,
    quarantine: bool = False,
    socket_mode: int = 0o600,
    socket_dir: Path | None = None,
    audit_path: Path | None = None,
    audit_fsync: FsyncPolicy = "never",
    judge: Judge | None = None,
    ssh: bool = False,
    dispatch_hosts: Collection[str] = (),
    dispatch_clock: Callable[[], float] | None = None,
    groups: Mapping[str, GroupSection] | None = None,
    grants: tuple[Grant, ...] = (),
    pool: PoolSection | None = None,
    approvals: ApprovalsSection | None = None,
    catalog: CatalogSection | None = None,
    **server: Any,
) -> None:
    """Start a daemon, run ``body`` against it, stop it (draining), all in one event loop.

    The daemon is ``daemon.assemble``'s, as `serve` builds it; ``runner`` replaces its
    runner (default: the scripted job runner; ``ssh=True``: the production SSH runner).
    ``dispatch_hosts`` are `dispatch = true`; ``dispatch_clock`` is their policy monitor's;
    ``pool`` is the `[pool]` section (`warm` hosts are connected, and checked, at start);
    ``groups`` and ``grants`` are the configuration's `[groups]` and `[[grants]]`;
    ``approvals`` its `[approvals]`, ``catalog`` its `[catalog]`.
    """

    commands = commands or shipped_commands(tmp_path)

    async def main() -> None:
        socket_path = (socket_dir or tmp_path) / "sshadapter.sock"
        audit_file = audit_path or tmp_path / "audit.jsonl"
        config = Config(
            server=ServerSection(
                socket_path=socket_path,
                allow=allow or Allow(uids=(os.getuid(),)),
                **{"evaluation_workers": 0, **server},  # in the loop unless a test asks
            ),
            paths=PathsSection(commands=commands, schemas=schemas),
            audit=AuditSection(
                path=audit_file,
                fsync=audit_fsync,
                quarantine_dir=tmp_path / "quarantine",
                quarantine_max_bytes=1024 * 1024 if quarantine else 0,
            ),
            pool=pool or PoolSection(),
            hosts=dict(
                hosts
                or {
                    alias: HostSection(
                        address="127.0.0.1",
                        user="nobody",
                        known_hosts=tmp_path / "known_hosts",
                        dispatch=alias in dispatch_hosts,
                    )
                    for alias in ("ci", "local")
                }
            ),
            groups=dict(groups or {}),
            grants=grants,
            approvals=approvals or ApprovalsSection(),
            catalog=catalog or CatalogSection(),
        )
        use = None if ssh else runner or job_runner()
        daemon = assemble(
            config, runner=use, clock=lambda: NOW, judge=judge, dispatch_clock=dispatch_clock
        )
        sock = bind_socket(socket_path, socket_mode, "")
        task = asyncio.create_task(daemon.serve(sock))
        ready = asyncio.create_task(daemon.ready.wait())
        await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # it failed to start: say why
            ready.cancel()
            task.result()
        try:
            await body(Running(socket_path, daemon, daemon.service, audit_file))
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 30)

    asyncio.run(main())


def scripted_service(tmp_path: Path) -> Service:
    """A real Service (assembled as `serve` does, not started) answering from the scripted
    job runner, with the shipped commands and hosts `ci` and `local`."""
    config = Config(
        server=ServerSection(allow=Allow(uids=(os.getuid(),)), evaluation_workers=0),
        paths=PathsSection(commands=shipped_commands(tmp_path), schemas=ROOT / "schemas"),
        audit=AuditSection(
            path=tmp_path / "audit.jsonl", fsync="never", quarantine_dir=tmp_path / "q"
        ),
        hosts={
            a: HostSection(address="127.0.0.1", user="nobody", known_hosts=tmp_path / "kh")
            for a in ("ci", "local")
        },
    )
    return assemble(config, runner=job_runner()).service


@contextlib.contextmanager
def approver_reachable_dir() -> Iterator[Path]:
    """A directory another uid (an approver) can reach: pytest's tmp_path is root's alone."""
    path = Path(tempfile.mkdtemp(prefix="sshadapter-approve-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
