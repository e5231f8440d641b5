"""The daemon's side of the dispatcher: does each dispatch host enforce the policy we expect?

Reference: docs/dispatcher.md "Drift". A host marked ``dispatch = true`` is
asked for its policy with the reserved command ``policy.DIGEST_COMMAND``,
which its dispatcher answers itself with the digest of the whole policy and
of each operation. An operation whose digest on the host differs from the
one the daemon computes from its own command files (or is missing there) is
refused with ``transport``/``policy_drift`` before anything is sent, until
a later check finds them equal.

When: lazily, never by polling the whole fleet. A host is checked when a
connection to it opens (``connected``, from the SSH runner's ``on_connect``,
or after a warm-up connect), then every ``RECHECK_SECONDS`` only while it has
an open connection (``open_hosts``), after each SIGHUP reload if it has one,
and soon after a call its dispatcher refused (``remote_refused``) or one
refused here as drifted (its state may be stale: the check connects), at most
every ``RECHECK_AFTER_REFUSAL_SECONDS``. A host never connected is never
checked, and at a reload a host without a connection forgets what was known
(it was known against the old command files): neither is held back, its
dispatcher still refuses what it does not know, and its next connection is
checked. A host that cannot be reached keeps what was last known. A host that
refuses the question or gives no valid answer (no dispatcher there, or no
valid policy) has every operation refused: ``dispatch = true`` says it must
run one. At most ``MAX_CHECKS_IN_FLIGHT`` checks run at once.

A host may have installed its own policy or its group's (``sshadapter policy
GROUP``, whose ``host`` is the group's name): only the operations and their
digests are compared, never the name.

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
from sshadapter.shown import shown
from sshadapter.strict_json import StrictJSONError, strict_loads

if TYPE_CHECKING:
    from sshadapter.config import Config

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SECONDS: Final = 10.0  # one exec of the dispatcher on a pooled connection
MAX_ANSWER_BYTES: Final = 1024 * 1024  # ~140 bytes per operation: thousands of operations
MAX_ANSWER_STDERR_BYTES: Final = 4096  # a refusal is one line
MAX_ANSWER_DEPTH: Final = 4  # {"operations": {name: digest}}
RECHECK_SECONDS: Final = 60.0  # a host reinstalled or updated by hand is noticed within this
# How often the watch looks for connected hosts due again: each is rechecked 60-65 s after
# its last check, so 1,000 hosts that connected at different times are asked spread out.
RECHECK_TICK_SECONDS: Final = 5.0
RECHECK_AFTER_REFUSAL_SECONDS: Final = 5.0  # a refused call asks again, at most this often
# Digest commands in flight at once (the daemon's checks, and `check --hosts`): a reload or
# `check --hosts` over 1,000 hosts asks 32 at a time, not 1,000 execs and connects at once.
MAX_CHECKS_IN_FLIGHT: Final = 32
# A state's detail (audit detail, log lines, `check --hosts`): a hint, not a transcript. What
# the host wrote in it (its refusal line, the names of its operations) is escaped (``shown``).
MAX_DETAIL_CHARS: Final = 200
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
        open_hosts: Callable[[], Iterable[str]] | None = None,
        max_in_flight: int = MAX_CHECKS_IN_FLIGHT,
    ) -> None:
        """``open_hosts()``: the aliases with an open connection now (the SSH runner's
        ``connections()``); without it no host counts as connected, so none is rechecked
        on the timer or at a reload."""
        self._runner = runner
        self._metrics = metrics
        self._clock = clock
        self._open_hosts = open_hosts or tuple
        self._slots = asyncio.Semaphore(max_in_flight)
        self._expected: dict[str, Mapping[str, Any]] = {}
        self._states: dict[str, HostState] = {}
        self._last_check: dict[str, float] = {}
        self._checking: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def hosts(self) -> list[str]:
        return sorted(self._expected)

    def expect(self, policies: Mapping[str, Mapping[str, Any]]) -> None:
        """Each dispatch host's policy as the command files give it (policy.host_policies).

        A host without an open connection forgets its state: it was proved against the
        previous policies, and is checked again when a connection opens.
        """
        self._expected = dict(policies)
        connected = self.open_hosts()
        for alias in [a for a in self._states if a not in connected]:
            del self._states[alias]
            self._metrics.dispatch_drifted.labels(alias).set(0)

    def state(self, alias: str) -> HostState | None:
        return self._states.get(alias)

    def refusal(self, op: Operation, host: str) -> str | None:
        """Why ``op`` may not be sent to ``host`` now (audit detail), or None.

        A refusal asks the host again soon (``suspect``): a host whose connection has
        closed is rechecked only so, and a fixed one is released by the next call.
        """
        state = self._states.get(host)
        if state is None or op.name not in state.drifted:
            return None
        self.suspect(host)
        return f"host {host} policy: {state.result}: {state.detail}"[:MAX_DETAIL_CHARS]

    def open_hosts(self) -> set[str]:
        """The dispatch hosts with an open connection now."""
        return {alias for alias in self._open_hosts() if alias in self._expected}

    async def check(self, alias: str) -> HostState:
        """Ask ``alias`` for its policy digests and compare them with the expected ones."""
        self._last_check[alias] = self._clock()
        self._checking.add(alias)
        try:
            async with self._slots:
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
        finally:
            self._checking.discard(alias)
        self._record(alias, state)
        return state

    async def check_many(self, aliases: Iterable[str]) -> list[HostState]:
        """Check each of ``aliases`` (at most MAX_CHECKS_IN_FLIGHT at once), in that order."""
        return list(await asyncio.gather(*(self.check(alias) for alias in aliases)))

    def connected(self, alias: str) -> None:
        """A new connection to ``alias`` is open (the SSH runner's ``on_connect``): check
        its policy in the background, unless it is no dispatch host, a check is under way
        (the check's own connect lands here too) or one began in the last
        RECHECK_AFTER_REFUSAL_SECONDS."""
        self.suspect(alias)

    def suspect(self, alias: str) -> None:
        """A call was refused by the host: check again soon, unless just checked."""
        if alias not in self._expected or alias in self._checking:
            return
        if self._clock() - self._last_check.get(alias, float("-inf")) < (
            RECHECK_AFTER_REFUSAL_SECONDS
        ):
            return
        self._last_check[alias] = self._clock()
        self._spawn(self.check(alias))

    def check_soon(self) -> None:
        """Check every host with an open connection, in the background (after a reload)."""
        self._spawn(self.check_many(sorted(self.open_hosts())))

    async def watch(
        self, interval: float = RECHECK_SECONDS, tick: float = RECHECK_TICK_SECONDS
    ) -> None:
        """Until cancelled, every ``tick`` seconds: check each host with an open connection
        whose last check is ``interval`` seconds old (or that was never checked)."""
        while True:
            await asyncio.sleep(tick)
            now = self._clock()
            due = [
                alias
                for alias in sorted(self.open_hosts())
                if alias not in self._checking
                and now - self._last_check.get(alias, float("-inf")) >= interval
            ]
            await self.check_many(due)

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
        line = shown(run.stderr.split(b"\n", 1)[0][:MAX_DETAIL_CHARS], MAX_DETAIL_CHARS)
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
    # The operations and their digests decide, never the document's own digest or name:
    # a member that installed its group's policy (host = the group) is as current.
    name = answer["host"]
    named = "" if name == expected.get("host") else f"installed as '{shown(name, 64)}'"
    extra = sorted(set(answer["operations"]) - set(wanted))
    if not extra:
        return HostState("current", frozenset(), named)
    detail = shown(f"the host also has {', '.join(extra)}", MAX_DETAIL_CHARS)
    return HostState("ahead", frozenset(), f"{detail}; {named}" if named else detail)


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
    if not isinstance(answer["host"], str):
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
    config: Config,
    policies: Mapping[str, Mapping[str, Any]],
    *,
    hosts: Iterable[str] | None = None,
    runner: Runner | None = None,
    max_in_flight: int = MAX_CHECKS_IN_FLIGHT,
) -> list[HostReport]:
    """Ask each dispatch host (of ``hosts``, when given: a group's members) for its policy,
    over the daemon's own kind of connection (``runner``: tests), at most
    ``max_in_flight`` at once; one report per host, by alias."""
    chosen = sorted(set(policies) if hosts is None else set(policies) & set(hosts))
    wanted = {alias: policies[alias] for alias in chosen}
    own = None
    if runner is None:
        from sshadapter.inventory.fleet import via_chain
        from sshadapter.runners.ssh.runner import SshRunner

        needed = {hop for alias in chosen for hop in (alias, *via_chain(alias, config.hosts))}
        runner = own = SshRunner({alias: config.hosts[alias] for alias in sorted(needed)})
    monitor = PolicyMonitor(runner, Metrics(), max_in_flight=max_in_flight)
    monitor.expect(wanted)
    try:
        states = await monitor.check_many(chosen)
    finally:
        if own is not None:
            await own.close()
    return [HostReport(alias, state) for alias, state in zip(chosen, states, strict=True)]


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
