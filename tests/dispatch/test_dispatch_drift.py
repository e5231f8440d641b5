"""The daemon's side of a dispatch host: remote refusals, and policies that drift apart.

Through the real daemon on a socket (tests/support/daemon_harness.py) with a scripted
runner that plays the host: the dispatcher's refusal status and line, and its
answers to the reserved digest command (made by the real dispatcher's own
``digest_answer``). tests/dispatch/test_dispatch_sshd.py repeats the drift case through
a real sshd and the real dispatcher.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
from daemon_harness import JOB_COMMAND, JOB_OUT, Running, with_daemon
from dispatch_support import ROOT, open_commands, policy_without, shipped_registry

from sshadapter.config import PoolSection
from sshadapter.contract.evaluate import evaluate
from sshadapter.contract.exitstatus import REFUSED_STATUS
from sshadapter.daemon.drift import RECHECK_AFTER_REFUSAL_SECONDS, PolicyMonitor, compare
from sshadapter.dispatch import dispatcher, policy
from sshadapter.errors import UpstreamError
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

REGISTRY = shipped_registry(("ci",))
CI_POLICY = policy.host_policies(REGISTRY)["ci"]
REVIEW_COMMAND = "review-cli status --json --change CR-1042"
REVIEW_OUT = (ROOT / "commands/review_status.fixtures/approved.stdout").read_bytes()
REFUSAL_LINE = b"sshadapter-dispatch: refused (bad_argument) sha256:" + b"0" * 64 + b"\n"
REFUSED = RunResult(b"", REFUSAL_LINE, REFUSED_STATUS)


def answer(document: Mapping[str, Any]) -> RunResult:
    """What the host's dispatcher prints for the digest command, for this policy."""
    return RunResult(dispatcher.digest_answer(document), b"", 0)


class Connected(ScriptedRunner):
    """A scripted host that counts as connected (``connections()``, as SshRunner's), so the
    daemon's monitor checks it again at a reload."""

    def connections(self) -> dict[str, int]:
        return {"ci": 1}


def host(digest_answer: RunResult, **commands: RunResult) -> ScriptedRunner:
    return Connected(
        {
            policy.DIGEST_COMMAND: digest_answer,
            JOB_COMMAND: RunResult(orjson.dumps(JOB_OUT), b"", 0),
            REVIEW_COMMAND: RunResult(REVIEW_OUT, b"", 0),
            **commands,
        }
    )


def call(tool: str, **args: str) -> dict[str, Any]:
    return {"op": "call", "tool": tool, "args": args}


REVIEW = call("review_status", change_id="CR-1042")
JOB = call("job_run_status", project_id="bluebird")


async def checked(d: Running) -> PolicyMonitor:
    """The daemon's monitor, once the check of `ci` its warm-up connect began is done."""
    monitor = d.service.dispatch
    assert monitor is not None
    for _ in range(200):
        if monitor.state("ci") is not None:
            return monitor
        await asyncio.sleep(0.01)
    raise AssertionError("no policy check at warm-up")


def metric(d: Running, name: str, **labels: str) -> float:
    value = d.service.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def run(
    tmp_path: Path,
    runner: ScriptedRunner,
    body: Callable[[Running], Awaitable[None]],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    commands = open_commands(tmp_path / "commands")
    with_daemon(
        tmp_path,
        body,
        runner=runner,
        commands=commands,
        dispatch_hosts=("ci",),
        dispatch_clock=clock,
        pool=PoolSection(warm=("ci",)),  # checked at start: connected at start
    )


def test_a_policy_one_operation_behind_is_detected_counted_and_refused(tmp_path: Path) -> None:
    """The host lacks review_status: it alone is refused (policy_drift), unsent, until updated."""
    runner = host(answer(policy_without(CI_POLICY, "review_status")))

    async def body(d: Running) -> None:
        monitor = await checked(d)
        state = monitor.state("ci")
        assert state is not None and (state.result, set(state.drifted)) == (
            "drift",
            {"review_status"},
        )
        assert metric(d, "sshadapter_dispatch_policy_checks_total", host="ci", result="drift") == 1
        assert metric(d, "sshadapter_dispatch_drifted_operations", host="ci") == 1

        refused = await d.ask(REVIEW)
        assert refused["error"] == {"code": "UPSTREAM_UNAVAILABLE", "retryable": False}
        assert REVIEW_COMMAND not in runner.calls  # nothing was sent
        record = d.audit_records()[-1]
        assert (record["stage"], record["reason"], record["attempts"]) == (
            "transport",
            "policy_drift",
            [],
        )
        assert record["command"] == REVIEW_COMMAND and "review_status" not in record["detail"]
        assert (await d.ask(JOB))["outcome"] == "success"  # the others go on
        labels = {"tool": "review_status", "reason": "policy_drift"}
        assert metric(d, "sshadapter_dispatch_refusals_total", **labels) == 1
        failed = {"tool": "review_status", "outcome": "failure", "code": "UPSTREAM_UNAVAILABLE"}
        assert metric(d, "sshadapter_calls_total", **failed) == 1

        # Policy on the host first, then the daemon's reload: checked again, and released.
        runner.table[policy.DIGEST_COMMAND] = answer(CI_POLICY)
        d.daemon.reload()
        for _ in range(200):
            current = monitor.state("ci")
            if current is not None and current.result == "current":
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"not rechecked after the reload: {monitor.state('ci')}")
        assert metric(d, "sshadapter_dispatch_drifted_operations", host="ci") == 0
        response = await d.ask(REVIEW)
        assert response["outcome"] == "success", response
        assert REVIEW_COMMAND in runner.calls

    run(tmp_path, runner, body)


def test_the_dispatchers_refusal_is_remote_refused_never_success_never_retried(
    tmp_path: Path,
) -> None:
    """Status 77 with the refusal line: UPSTREAM_UNAVAILABLE, not retryable, one attempt."""
    runner = host(answer(CI_POLICY), **{JOB_COMMAND: REFUSED})
    now = [1000.0]

    async def body(d: Running) -> None:
        await checked(d)
        response = await d.ask(JOB)  # job_run_status retries UPSTREAM_UNAVAILABLE: not this one
        assert response["error"] == {"code": "UPSTREAM_UNAVAILABLE", "retryable": False}
        record = d.audit_records()[-1]
        assert (record["stage"], record["reason"]) == ("exit", "remote_refused")
        assert len(record["attempts"]) == 1 and record["attempts"][0]["exit_status"] == 77
        assert record["detail"] == REFUSAL_LINE.decode().strip()
        assert runner.calls.count(JOB_COMMAND) == 1
        labels = {"tool": "job_run_status", "reason": "remote_refused"}
        assert metric(d, "sshadapter_dispatch_refusals_total", **labels) == 1
        evidence = {"tool": "job_run_status", "stage": "exit", "reason": "remote_refused"}
        assert metric(d, "sshadapter_rejections_total", **evidence) == 0  # not bad evidence
        # Checked at warm-up a moment ago: no second question yet. Later, a refusal asks again.
        assert runner.calls.count(policy.DIGEST_COMMAND) == 1
        now[0] += RECHECK_AFTER_REFUSAL_SECONDS
        await d.ask(JOB)
        for _ in range(200):
            if runner.calls.count(policy.DIGEST_COMMAND) == 2:
                break
            await asyncio.sleep(0.01)
        assert runner.calls.count(policy.DIGEST_COMMAND) == 2

    run(tmp_path, runner, body, clock=lambda: now[0])


def test_status_77_without_the_line_or_off_a_dispatch_host_is_an_invalid_response() -> None:
    """Only the dispatcher's own refusal counts; a program's 77 stays an undeclared status."""
    op = REGISTRY.operations["job_run_status"]
    now = REGISTRY.operations["job_run_status"]
    args = {"project_id": "bluebird"}
    from daemon_harness import NOW

    refused = evaluate(op, args, REFUSED, NOW)
    assert refused.failure is not None
    assert (refused.code, refused.failure.retryable, refused.stage, refused.reason) == (
        "UPSTREAM_UNAVAILABLE",
        False,
        "exit",
        "remote_refused",
    )
    bare = evaluate(op, args, RunResult(b"", b"no line\n", 77), NOW)
    assert (bare.code, bare.reason) == ("INVALID_RESPONSE", "undeclared_exit_status")
    plain = shipped_registry(()).operations["job_run_status"]
    assert not plain.dispatched and now.dispatched
    elsewhere = evaluate(plain, args, REFUSED, NOW)
    assert (elsewhere.code, elsewhere.reason) == ("INVALID_RESPONSE", "undeclared_exit_status")


def test_a_host_without_the_dispatcher_has_every_operation_refused(tmp_path: Path) -> None:
    """`dispatch = true` but the shell answers the digest command (a comment): fail closed."""
    runner = host(RunResult(b"", b"", 0))

    async def body(d: Running) -> None:
        monitor = await checked(d)
        state = monitor.state("ci")
        assert state is not None and state.result == "bad_answer"
        assert state.drifted == {"deploy_status", "job_run_status", "review_status"}
        assert (await d.ask(JOB))["error"]["code"] == "UPSTREAM_UNAVAILABLE"
        assert JOB_COMMAND not in runner.calls
        assert (await d.ask(call("load_average")))["outcome"] == "failure"  # local: sent
        assert "cat /proc/loadavg" in runner.calls

    run(tmp_path, runner, body)


def test_compare_reads_every_kind_of_answer() -> None:
    """current, ahead, drift, refused and bad_answer, from what the host prints."""
    extra = {
        **CI_POLICY,
        "operations": {**CI_POLICY["operations"], "new_tool": {"argv": ["x"], "params": {}}},
    }
    extra = policy_without(extra)
    changed = dict(CI_POLICY["operations"])
    changed["job_run_status"] = {**changed["job_run_status"], "params": {}}
    cases = {
        "current": (answer(CI_POLICY), set()),
        "ahead": (answer(extra), set()),
        "drift": (answer(policy_without({**CI_POLICY, "operations": changed})), {"job_run_status"}),
        "refused": (REFUSED, set(CI_POLICY["operations"])),
        "bad_answer": (RunResult(b"{}", b"", 0), set(CI_POLICY["operations"])),
    }
    for result, (run_result, drifted) in cases.items():
        state = compare(CI_POLICY, run_result)
        assert (state.result, set(state.drifted)) == (result, drifted)
    for garbage in (b"not json", b'{"digest": 1}', dispatcher.digest_answer(CI_POLICY) + b"x"):
        assert compare(CI_POLICY, RunResult(garbage, b"", 0)).result == "bad_answer"


def test_an_unreachable_host_keeps_what_was_last_known(tmp_path: Path) -> None:
    """Never reached: calls go on (the host still enforces); reached then lost: state kept."""
    failing = True

    async def digest() -> RunResult:
        if failing:
            raise UpstreamError("connect_refused", retryable=True, ran=False)
        return answer(policy_without(CI_POLICY, "job_run_status"))

    runner = host(RunResult(b"", b"", 0))
    runner.table[policy.DIGEST_COMMAND] = digest

    async def body(d: Running) -> None:
        monitor = d.service.dispatch
        assert monitor is not None
        await monitor.check("ci")
        assert monitor.state("ci") is None
        assert (await d.ask(JOB))["outcome"] == "success"
        nonlocal failing
        failing = False
        await monitor.check("ci")
        failing = True
        await monitor.check("ci")
        state = monitor.state("ci")
        assert state is not None and state.result == "drift"
        assert (await d.ask(JOB))["error"]["code"] == "UPSTREAM_UNAVAILABLE"
        labels = {"host": "ci", "result": "unreachable"}
        assert metric(d, "sshadapter_dispatch_policy_checks_total", **labels) >= 2

    run(tmp_path, runner, body)
