"""The daemon's side of the dispatcher: does each dispatch host enforce the policy we expect?

Reference: docs/dispatcher.md "Drift". A host marked ``dispatch = true`` is
asked for its policy with the reserved command ``policy.DIGEST_COMMAND``,
which its dispatcher answers itself with the digest of the whole policy and
of each operation. An operation whose digest on the host differs from the
one the daemon computes from its own command files (or is missing there) is
refused with ``transport``/``policy_drift`` before anything is sent, until
a later check finds them equal.

When: when a connection to the host opens (``suspect``, from assemble's
``on_connect``), after each SIGHUP reload, every ``RECHECK_SECONDS``, and
soon after a call the host's dispatcher refused (``remote_refused``), at most
every ``RECHECK_AFTER_REFUSAL_SECONDS``. A host that cannot be reached keeps
what was last known; one never reached is not held back (its dispatcher
still refuses what it does not know). A host that refuses the question or
gives no valid answer (no dispatcher there, or no valid policy) has every
operation refused: ``dispatch = true`` says it must run one.

Each check is counted in ``sshadapter_dispatch_policy_checks_total{host,
result}`` (result from ``RESULTS``); ``sshadapter_dispatch_drifted_operations
{host}`` is how many operations are refused now. A change of state is logged.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sshadapter.contract.evaluate import dispatcher_refused
from sshadapter.contract.registry import Operation
from sshadapter.daemon.metrics import Metrics
from sshadapter.dispatch import policy
from sshadapter.errors import UpstreamError
from sshadapter.runners.interface import Runner, RunResult
from sshadapter.strict_json import StrictJSONError, strict_loads

if TYPE_CHECKING:
    from sshadapter.config import Config

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SECONDS: Final = 10.0  # one exec of the dispatcher on a pooled connection
MAX_ANSWER_BYTES: Final = 1024 * 1024  # ~140 bytes per operation: thousands of operations
MAX_ANSWER_STDERR_BYTES: Final = 4096  # a refusal is one line
MAX_ANSWER_DEPTH: Final = 4  # {"operations": {name: digest}}
RECHECK_SECONDS: Final = 60.0  # a host reinstalled or updated by hand is noticed within this
RECHECK_AFTER_REFUSAL_SECONDS: Final = 5.0  # a refused call asks again, at most this often
RESULTS: Final = ("current", "ahead", "drift", "refused", "bad_answer", "unreachable")
_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class HostState:
    """What the last check of one host proved."""

    result: str
    """One of RESULTS."""
    drifted: frozenset[str]
    """Operations refused as policy_drift until the next check."""
    detail: str = ""


class PolicyMonitor:
    """The policy state of every dispatch host, checked through the daemon's runner."""

    def __init__(
        self,
        runner: Runner,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runner = runner
        self._metrics = metrics
        self._clock = clock
        self._expected: dict[str, Mapping[str, Any]] = {}
        self._states: dict[str, HostState] = {}
        self._last_check: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def hosts(self) -> list[str]:
        return sorted(self._expected)

    def expect(self, policies: Mapping[str, Mapping[str, Any]]) -> None:
        """Each dispatch host's policy as the command files give it (policy.host_policies)."""
        self._expected = dict(policies)

    def state(self, alias: str) -> HostState | None:
        return self._states.get(alias)

    def refusal(self, op: Operation, host: str) -> str | None:
        """Why ``op`` may not be sent to ``host`` now (audit detail), or None."""
        state = self._states.get(host)
        if state is None or op.name not in state.drifted:
            return None
        return f"host {host} policy: {state.result}: {state.detail}"[:200]

    async def check(self, alias: str) -> HostState:
        """Ask ``alias`` for its policy digests and compare them with the expected ones."""
        self._last_check[alias] = self._clock()
        try:
            run = await self._runner.run(
                alias,
                policy.DIGEST_COMMAND,
                timeout=CHECK_TIMEOUT_SECONDS,
                max_stdout=MAX_ANSWER_BYTES,
                max_stderr=MAX_ANSWER_STDERR_BYTES,
            )
        except UpstreamError as exc:
            previous = self._states.get(alias)
            state = HostState(
                "unreachable", previous.drifted if previous else frozenset(), exc.reason
            )
        else:
            state = compare(self._expected.get(alias, _EMPTY), run)
        self._record(alias, state)
        return state

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(alias) for alias in self.hosts))

    def suspect(self, alias: str) -> None:
        """A call was refused by the host: check again soon, unless just checked."""
        if self._clock() - self._last_check.get(alias, float("-inf")) < (
            RECHECK_AFTER_REFUSAL_SECONDS
        ):
            return
        self._last_check[alias] = self._clock()
        self._spawn(self.check(alias))

    def check_soon(self) -> None:
        """Check every host in the background (after a reload)."""
        self._spawn(self.check_all())

    async def watch(self, interval: float = RECHECK_SECONDS) -> None:
        """Check every host every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await self.check_all()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record(self, alias: str, state: HostState) -> None:
        """Count the check; keep and log a new state (an unreachable host keeps its last one)."""
        self._metrics.dispatch_checks.labels(alias, state.result).inc()
        if state.result == "unreachable":
            log.warning("dispatch host %s: policy not checked: %s", alias, state.detail)
            return
        previous = self._states.get(alias)
        self._states[alias] = state
        self._metrics.dispatch_drifted.labels(alias).set(len(state.drifted))
        if previous is not None and (previous.result, previous.drifted) == (
            state.result,
            state.drifted,
        ):
            return
        if state.drifted:
            log.error(
                "dispatch host %s: policy %s, refusing %s (%s)",
                alias,
                state.result,
                ", ".join(sorted(state.drifted)),
                state.detail,
            )
        else:
            log.info("dispatch host %s: policy %s %s", alias, state.result, state.detail)


_EMPTY: Final[Mapping[str, Any]] = {"digest": "", "operations": {}}


def compare(expected: Mapping[str, Any], run: RunResult) -> HostState:
    """What the host's answer to DIGEST_COMMAND says about the policy the daemon expects."""
    everything = frozenset(expected["operations"])
    if dispatcher_refused(run):
        line = run.stderr.split(b"\n", 1)[0][:200].decode("utf-8", "replace")
        return HostState("refused", everything, line)
    answer = _read_answer(run)
    if answer is None:
        status = run.exit_status
        return HostState(
            "bad_answer",
            everything,
            f"exit status {status}, {len(run.stdout)} bytes: is the dispatcher installed?",
        )
    wanted = policy.operation_digests(expected)
    drifted = frozenset(
        name for name, want in wanted.items() if answer["operations"].get(name) != want
    )
    if drifted:
        missing = sorted(name for name in drifted if name not in answer["operations"])
        return HostState(
            "drift",
            drifted,
            f"{len(drifted)} of {len(wanted)} differ, {len(missing)} missing on the host",
        )
    if answer["digest"] == expected["digest"]:
        return HostState("current", frozenset())
    extra = sorted(set(answer["operations"]) - set(wanted))
    return HostState("ahead", frozenset(), f"the host also has {', '.join(extra) or '-'}")


def _read_answer(run: RunResult) -> dict[str, Any] | None:
    """The dispatcher's answer, checked: {dispatcher, format, host, digest, operations}."""
    if run.exit_status != 0 or len(run.stdout) > MAX_ANSWER_BYTES:
        return None
    try:
        answer = strict_loads(run.stdout, max_bytes=MAX_ANSWER_BYTES, max_depth=MAX_ANSWER_DEPTH)
    except StrictJSONError:
        return None
    if not isinstance(answer, dict) or set(answer) != {
        "dispatcher",
        "format",
        "host",
        "digest",
        "operations",
    }:
        return None
    operations = answer["operations"]
    if answer["format"] != policy.POLICY_FORMAT or not isinstance(operations, dict):
        return None
    digests: Iterable[Any] = [answer["digest"], *operations.values()]
    if not all(isinstance(d, str) and _DIGEST.fullmatch(d) for d in digests):
        return None
    return answer


# `sshadapter check --hosts` ---------------------------------------------------------------


@dataclass(frozen=True)
class HostReport:
    """One line of `sshadapter check --hosts`."""

    host: str
    state: HostState

    @property
    def ok(self) -> bool:
        return self.state.result in ("current", "ahead")

    def as_json(self) -> dict[str, Any]:
        return {
            "tool": "-",
            "case": self.host,
            "kind": "dispatch_policy",
            "expected": {"policy": "current"},
            "got": {
                "policy": self.state.result,
                "refused": sorted(self.state.drifted),
                "detail": self.state.detail,
            },
            "ok": self.ok,
            "rejection": None,
        }


async def check_hosts(
    config: Config, policies: Mapping[str, Mapping[str, Any]]
) -> list[HostReport]:
    """Ask every dispatch host for its policy, over the daemon's own kind of connection."""
    from sshadapter.runners.ssh.runner import SshRunner

    runner = SshRunner({alias: config.hosts[alias] for alias in policies})
    monitor = PolicyMonitor(runner, Metrics())
    monitor.expect(policies)
    try:
        return [HostReport(alias, await monitor.check(alias)) for alias in monitor.hosts]
    finally:
        await runner.close()


def format_hosts(reports: list[HostReport]) -> str:
    lines = [f"{'host':<12}  {'policy':<11}  refused"]
    for report in reports:
        refused = ", ".join(sorted(report.state.drifted)) or "-"
        detail = f"  ({report.state.detail})" if report.state.detail else ""
        ok = "ok" if report.ok else "MISS"
        lines.append(f"{report.host:<12}  {report.state.result:<11}  {refused}{detail}  {ok}")
    misses = sum(not r.ok for r in reports)
    lines.append(
        f"{len(reports)} dispatch hosts checked: {len(reports) - misses} ok, {misses} missed"
    )
    return "\n".join(lines)
