"""Large outputs judged off the event loop, in worker processes.

Stages 6-10 of a large output (strict parse, schema, checks, projection, and
serializing the envelope) are tens of milliseconds of pure CPU per MiB, and
orjson and jsonschema-rs hold the GIL the whole time, so a thread would not
help: on the event loop they stall every other caller's small call behind one
agent's 8 MB pull. Outputs over ``OFFLOAD_ABOVE_BYTES`` are therefore judged in
a small pool of worker processes, so the loop, and with it every small call, is
free while they work. (They keep the daemon's CPU priority: the shipped unit's
system call filter leaves setpriority out, and the scheduler already favours the
loop, which sleeps between packets, over a worker that computes.) A worker
builds its registry from the very bytes the daemon loaded (``RegistrySource``),
so it judges by exactly the contract the daemon serves, reloads included. It
returns only the sealed response line, the verdict's fields and the digests of
the output; the parsed value never crosses back.

If the pool breaks (a worker killed), the output is judged in the daemon
instead, and a new pool is started: the answer is late, never lost. Workers that
cannot start at all (a sandbox that refuses them, an entry script without a
``__name__ == "__main__"`` guard, which every spawned worker runs again) break
each new pool too: after ``MAX_POOL_FAILURES`` in a row the daemon says so once
and judges everything itself, as with ``evaluation_workers = 0``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import hashlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from sshadapter.evaluate import Sealed, Verdict, evaluate, seal_line
from sshadapter.registry import Operation, Registry, RegistrySource, build_registry
from sshadapter.runners.interface import RunResult

log = logging.getLogger(__name__)

# Below this the whole judgement costs well under a millisecond in the loop, less than
# the round trip to a worker; above it the work grows ~25 ms per MiB.
OFFLOAD_ABOVE_BYTES: Final = 64 * 1024
_PR_SET_PDEATHSIG: Final = 1  # linux/prctl.h
_CACHED_REGISTRIES: Final = 2  # in a worker: the current set and the one before a reload
# Pools broken in a row, no output judged by a worker in between, before the daemon stops
# starting new ones: one kill is bad luck, three mean a worker cannot live here.
MAX_POOL_FAILURES: Final = 3

_registries: dict[str, Registry] = {}  # a worker's registries, by source digest


@dataclass(frozen=True, slots=True)
class Judged:
    """One attempt's evidence, judged: the verdict and what the audit says of the bytes."""

    verdict: Verdict
    evidence: Mapping[str, Any]


def evidence_of(run: RunResult) -> dict[str, Any]:
    """What the audit says of the bytes that came back: sizes and digests, never the bytes."""
    return {
        "exit_status": run.exit_status,
        "stdout_bytes": len(run.stdout),
        "stdout_sha256": hashlib.sha256(run.stdout).hexdigest(),
        "stderr_bytes": len(run.stderr),
        "stderr_sha256": hashlib.sha256(run.stderr).hexdigest(),
        "transport_error": None,
    }


class Judge:
    """Stages 6-10 for the Service: in the loop for small outputs, in a worker for large."""

    def __init__(self, workers: int) -> None:
        """``workers`` = 0: everything is judged in the loop."""
        self.workers = workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._failures = 0
        """Pools broken since a worker last judged an output."""

    def start(self, registry: Registry) -> None:
        """Start the workers and have each build ``registry`` ahead of the first large output.

        Never raises (start and SIGHUP): a pool that cannot be used is replaced, or given up.
        """
        while self.workers:
            try:
                if self._pool is None:
                    self._pool = _new_pool(self.workers)
                for _ in range(self.workers):
                    self._pool.submit(_warm, registry.source)
                return
            except (concurrent.futures.BrokenExecutor, OSError) as exc:
                self._broken(exc)

    async def judge(
        self,
        registry: Registry,
        op: Operation,
        args: Mapping[str, Any],
        run: RunResult,
        now: datetime,
        request_id: str,
    ) -> Judged:
        pool = self._pool
        if pool is None or len(run.stdout) <= OFFLOAD_ABOVE_BYTES:
            return Judged(evaluate(op, args, run, now), evidence_of(run))
        loop = asyncio.get_running_loop()
        try:
            fields, sealed, evidence = await loop.run_in_executor(
                pool, _judge, registry.source, op.name, dict(args), run, now, request_id
            )
        except (concurrent.futures.BrokenExecutor, OSError) as exc:
            log.error("evaluation worker died: judging %s in the daemon", request_id)
            self._broken(exc)
            self.start(registry)
            return Judged(evaluate(op, args, run, now), evidence_of(run))
        self._failures = 0
        return Judged(replace(Verdict(**fields), sealed=sealed), evidence)

    def _broken(self, exc: BaseException) -> None:
        """Drop a pool that broke; after ``MAX_POOL_FAILURES`` in a row, start no more."""
        old, self._pool = self._pool, None
        if old is not None:
            old.shutdown(wait=False, cancel_futures=True)
        self._failures += 1
        if self._failures < MAX_POOL_FAILURES:
            log.error("evaluation workers broke (%s): starting new ones", exc)
        else:
            log.error(
                "evaluation workers broke %d times in a row (last: %s): every output is judged "
                "in the daemon until it restarts",
                self._failures,
                exc,
            )
            self.workers = 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _new_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    # spawn, not fork: the daemon has threads (metrics listener, fsync hand-offs), and a
    # forked child of a threaded process may inherit a lock held by one of them.
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(os.getpid(),),
    )


def _init_worker(daemon_pid: int) -> None:
    """In the worker: die with the daemon; leave SIGTERM and SIGINT to it (it drains, then
    stops us)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # Linux: killed when the daemon dies, even by SIGKILL (no orphan keeps 60 MB)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != daemon_pid:  # the daemon died before the line above
        os._exit(0)


def _registry(source: RegistrySource) -> Registry:
    digest = source.digest
    registry = _registries.get(digest)
    if registry is None:
        registry = build_registry(source, hosts=None)  # the daemon checked the hosts
        while len(_registries) >= _CACHED_REGISTRIES:
            _registries.pop(next(iter(_registries)))
        _registries[digest] = registry
    return registry


def _warm(source: RegistrySource) -> None:
    _registry(source)


def _judge(
    source: RegistrySource,
    name: str,
    args: dict[str, Any],
    run: RunResult,
    now: datetime,
    request_id: str,
) -> tuple[dict[str, Any], Sealed, dict[str, Any]]:
    """In a worker: evaluate and seal; only the line and the verdict's fields go back."""
    op = _registry(source).operations[name]
    verdict = evaluate(op, args, run, now)
    sealed = seal_line(op, request_id, verdict)
    fields = {
        "code": verdict.code,
        "retryable": verdict.retryable,
        "stage": verdict.stage,
        "reason": verdict.reason,
        "detail": verdict.detail,
        "schema_path": verdict.schema_path,
        "instance_path": verdict.instance_path,
    }
    return fields, sealed, evidence_of(run)
