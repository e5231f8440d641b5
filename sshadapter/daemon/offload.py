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
returns what the loop's own judging returns (``judge_here``): the verdict, sealed,
and the digests of the output; the parsed value never crosses back.

Pools have generations. If the current pool breaks (a worker killed: the OOM
killer under load is an ordinary event), it is replaced once, whichever of the
calls waiting on it sees the break first, and counted once; every output that
was waiting on it is tried again on the replacement (``MAX_JUDGE_ATTEMPTS``),
and judged in the daemon only if that one breaks under it too: the answer is
late, never lost. A call that sees an older pool break (already replaced) never
counts it or tears down the replacement. Workers that cannot start at all (a
sandbox that refuses them, an entry script without a ``__name__ == "__main__"``
guard, which every spawned worker runs again) break each new pool too: after
``MAX_POOL_FAILURES`` in a row the daemon says so once and judges everything
itself, as with ``evaluation_workers = 0``.

No call waits for a worker longer than ``JUDGE_TIMEOUT_SECONDS``: then it is
answered INTERNAL (stage ``internal``, reason ``evaluation_timeout``) and
audited, and if the pool finished nothing in that time (a worker stopped,
swapped out or wedged) its workers are killed and a new pool is started (a
pool failure like a kill). Closing the pool never blocks the loop: workers get
``WORKER_EXIT_GRACE_SECONDS`` to exit, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sshadapter.contract.evaluate import Verdict, evaluate, sealed_verdict
from sshadapter.contract.registry import Operation, Registry, build_registry
from sshadapter.contract.sources import RegistrySource
from sshadapter.daemon.records import Evidence
from sshadapter.errors import Failure
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
# How long a call waits for a worker's verdict before it is answered INTERNAL
# (evaluation_timeout). The largest output a tool may declare (16 MiB) is judged in
# under a second (~25 ms per MiB, at most twice that on inputs chosen to be slow), so
# 20 s covers a queue of the largest outputs behind one worker on a loaded machine; a
# pool that finished nothing for this long is not slow but stopped, swapped out or
# wedged. Shorter than drain_timeout_seconds' default (30 s), so a drain ends on it.
JUDGE_TIMEOUT_SECONDS: Final = 20.0
# Pools one output is tried in: a pool broken under it (a worker killed, most often for
# reasons of its own: the OOM killer picks the largest process) is replaced and the
# output tried again there, off the loop; broken twice, it is judged in the daemon.
MAX_JUDGE_ATTEMPTS: Final = 2
# At close, how long workers get to exit once told to (an idle one takes milliseconds);
# then SIGKILL: a stopped or wedged one never would, and SIGTERM must end the daemon.
WORKER_EXIT_GRACE_SECONDS: Final = 1.0

_registries: dict[str, Registry] = {}  # a worker's registries, by source digest


@dataclass(frozen=True, slots=True)
class Judged:
    """One attempt's evidence, judged, as it comes back from a worker or from the loop."""

    verdict: Verdict
    """Sealed: its response line made, the data it holds dropped."""
    evidence: Evidence
    """What the audit says of the bytes."""


def judge_here(
    op: Operation, args: Mapping[str, Any], run: RunResult, now: datetime, request_id: str
) -> Judged:
    """Stages 6-10 and the envelope, where this runs: in the loop or in a worker."""
    return Judged(sealed_verdict(op, request_id, evaluate(op, args, run, now)), Evidence.of(run))


@dataclass(eq=False, slots=True)
class _Pool:
    """One generation of workers: calls that saw it break replace it only while it is current."""

    executor: concurrent.futures.ProcessPoolExecutor
    last_done: float = field(default_factory=time.monotonic)
    """When a job of this pool last finished (or the pool started): progress, for stalls."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        future = self.executor.submit(fn, *args)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled():  # in the executor's thread: one float, set atomically
            self.last_done = time.monotonic()


class Judge:
    """Stages 6-10 for the Service: in the loop for small outputs, in a worker for large."""

    def __init__(self, workers: int, *, timeout_seconds: float = JUDGE_TIMEOUT_SECONDS) -> None:
        """``workers`` = 0: everything is judged in the loop. ``timeout_seconds``: how
        long a call waits for a worker (tests shorten it)."""
        self.workers = workers
        self.timeout_seconds = timeout_seconds
        self._pool: _Pool | None = None
        """The current generation; a call that saw another one fail leaves this one be."""
        self._failures = 0
        """Pools broken since a worker last judged an output."""
        self._registry: Registry | None = None

    @property
    def failures(self) -> int:
        """Pools broken (or killed as stuck) in a row, since a worker last judged an output."""
        return self._failures

    def start(self, registry: Registry) -> None:
        """Start the workers and have each build ``registry`` ahead of the first large output.

        Never raises (start and SIGHUP): a pool that cannot be used is replaced, or given up.
        """
        self._registry = registry
        while self.workers:
            pool = self._pool
            try:
                if pool is None:
                    pool = self._pool = _Pool(_new_pool(self.workers))
                for _ in range(self.workers):
                    pool.submit(_warm, registry.source)
                return
            except (concurrent.futures.BrokenExecutor, OSError) as exc:
                self._drop(pool, f"broke ({exc})")

    async def judge(
        self,
        registry: Registry,
        op: Operation,
        args: Mapping[str, Any],
        run: RunResult,
        now: datetime,
        request_id: str,
    ) -> Judged:
        if len(run.stdout) <= OFFLOAD_ABOVE_BYTES:
            return judge_here(op, args, run, now, request_id)
        deadline = time.monotonic() + self.timeout_seconds
        for attempt in range(1, MAX_JUDGE_ATTEMPTS + 1):
            pool = self._pool
            if pool is None:  # given up, or closed: judged here, as with no workers
                break
            try:
                future = pool.submit(
                    _judge, registry.source, op.name, dict(args), run, now, request_id
                )
                judged: Judged = await asyncio.wait_for(
                    asyncio.wrap_future(future), max(0.0, deadline - time.monotonic())
                )
            except TimeoutError:
                return self._timed_out(pool, op, run, request_id)
            except (concurrent.futures.BrokenExecutor, OSError) as exc:
                again = attempt < MAX_JUDGE_ATTEMPTS
                log.error(
                    "%s: evaluation worker died under it: %s",
                    request_id,
                    "judging it again in new workers" if again else "judging it in the daemon",
                )
                self._replace(pool, f"broke ({exc})")
                if not again:
                    break
                continue  # within the same deadline: past it, the next wait times out at once
            self._failures = 0
            return judged
        return judge_here(op, args, run, now, request_id)

    def _timed_out(self, pool: _Pool, op: Operation, run: RunResult, request_id: str) -> Judged:
        """No verdict within the bound: a closed failure; a pool that did nothing is killed."""
        stalled = time.monotonic() - pool.last_done >= self.timeout_seconds
        if stalled:
            self._replace(pool, f"finished nothing in {self.timeout_seconds:g}s (stopped or stuck)")
        log.error(
            "%s %s: no evaluation worker judged its output within %gs: answered INTERNAL "
            "(evaluation_timeout)",
            request_id,
            op.name,
            self.timeout_seconds,
        )
        failure = Failure(
            "INTERNAL",
            False,
            "internal",
            "evaluation_timeout",
            f"no verdict from an evaluation worker within {self.timeout_seconds:g}s",
        )
        return Judged(sealed_verdict(op, request_id, Verdict(failure=failure)), Evidence.of(run))

    def _replace(self, pool: _Pool, why: str) -> None:
        """``pool`` failed: if it is still the current one, drop it and start the next."""
        if self._drop(pool, why) and self._registry is not None:
            self.start(self._registry)

    def _drop(self, pool: _Pool | None, why: str) -> bool:
        """Drop the current pool, failed: kill its workers and count it; after
        ``MAX_POOL_FAILURES`` in a row, start no more. A pool already replaced is left
        alone (False): its failure was counted by whoever saw it first."""
        if pool is not self._pool:
            return False
        self._pool = None
        if pool is not None:
            _discard(pool.executor)
        self._failures += 1
        if self._failures < MAX_POOL_FAILURES:
            log.error("evaluation workers %s: starting new ones", why)
        else:
            log.error(
                "evaluation workers failed %d times in a row (last: %s): every output is "
                "judged in the daemon until it restarts",
                self._failures,
                why,
            )
            self.workers = 0
        return True

    async def close(self) -> None:
        """Stop the workers without blocking the loop: idle ones exit when told to; any
        still there after ``WORKER_EXIT_GRACE_SECONDS`` (stopped, wedged) are killed."""
        pool, self._pool = self._pool, None
        self.workers = 0
        if pool is None:
            return
        processes = list((pool.executor._processes or {}).values())
        pool.executor.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(_reap, processes, WORKER_EXIT_GRACE_SECONDS)


def _discard(executor: concurrent.futures.ProcessPoolExecutor) -> None:
    """Kill a failed pool's workers (a stopped one would never take the end sentinel) and
    let its manager thread wind down; every future still waiting on it breaks."""
    # The executor's own table of its workers: the only handle on them before Python 3.14's
    # kill_workers(). A worker already gone is skipped (Process.kill checks returncode).
    for process in list((executor._processes or {}).values()):
        process.kill()
    executor.shutdown(wait=False, cancel_futures=True)


def _reap(processes: Sequence[multiprocessing.process.BaseProcess], grace: float) -> None:
    """In a thread: wait up to ``grace`` for ``processes`` to exit, then SIGKILL the rest."""
    deadline = time.monotonic() + grace
    left = {process.sentinel: process for process in processes}
    while left and (remaining := deadline - time.monotonic()) > 0:
        for sentinel in multiprocessing.connection.wait(list(left), remaining):
            left.pop(sentinel)  # type: ignore[arg-type]  # one of the sentinels given: an int
    for process in left.values():
        log.error("evaluation worker %s did not exit when told to: killed", process.pid)
        process.kill()


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
) -> Judged:
    """In a worker: what the loop would do (``judge_here``), with the worker's registry."""
    return judge_here(_registry(source).operations[name], args, run, now, request_id)
