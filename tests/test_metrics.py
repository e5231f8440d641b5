"""Prometheus metrics: finite labels, expected counts, and an exposition promtool accepts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import asyncssh
import orjson
import pytest
from daemon_harness import JOB_COMMAND, JOB_OUT, Running, shipped_commands, with_daemon

from sshadapter.config import HostSection
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

CALL = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}
LOAD = {"op": "call", "tool": "load_average", "args": {}}


def series(exposition: bytes) -> set[str]:
    return {
        line.split(" ")[0]
        for line in exposition.decode().splitlines()
        if line and not line.startswith("#")
    }


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing: scripts/install-test-deps installs Debian's prometheus")
        pytest.skip("promtool not installed (Debian package prometheus)")
    return path


def test_unknown_tool_names_do_not_grow_the_series(tmp_path: Path) -> None:
    """1,000 calls naming 1,000 different unknown tools add no series after the first."""

    async def body(d: Running) -> None:
        await d.ask({"op": "call", "tool": "warmup", "args": {}})
        before = series(d.service.metrics.exposition())
        for i in range(1000):
            await d.ask({"op": "call", "tool": f"tool_{i}_{'x' * (i % 50)}", "args": {}})
        after = d.service.metrics.exposition()
        assert series(after) == before
        assert (
            b'sshadapter_calls_total{code="INVALID_REQUEST",outcome="failure",'
            b'tool="sshadapter"} 1001.0' in after
        )
        assert b"tool_9" not in after

    with_daemon(tmp_path, body)


def test_counters_after_accepted_and_rejected_calls_pass_promtool(tmp_path: Path) -> None:
    """Two accepted calls, a schema rejection, a denial: exact counts; a denial is no rejection."""
    answers = [RunResult(b'{"project_id": "bluebird", "state": {"value": "x"}}', b"", 0)]

    async def next_answer() -> RunResult:
        return answers.pop() if answers else RunResult(orjson.dumps(JOB_OUT), b"", 0)

    async def body(d: Running) -> None:
        for _ in range(3):
            await d.ask(CALL)
        await d.ask({"op": "call", "tool": "review_status", "args": {"change_id": "CR-1"}})
        text = d.service.metrics.exposition().decode()
        for line in [
            'sshadapter_calls_total{code="none",outcome="success",tool="job_run_status"} 2.0',
            'sshadapter_calls_total{code="INVALID_RESPONSE",outcome="failure",'
            'tool="job_run_status"} 1.0',
            'sshadapter_rejections_total{reason="schema_mismatch",stage="schema",'
            'tool="job_run_status"} 1.0',
            'sshadapter_calls_total{code="DENIED",outcome="failure",tool="review_status"} 1.0',
            'sshadapter_call_duration_seconds_count{tool="job_run_status"} 3.0',
            'sshadapter_output_bytes_count{tool="job_run_status"} 3.0',
            'sshadapter_build_info{version="0.1.0"} 1.0',
        ]:
            assert line in text, line
        assert 'stage="authorize"' not in text  # an answer, not bad evidence
        checked = subprocess.run(
            [promtool(), "check", "metrics"], input=text, text=True, capture_output=True, timeout=30
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr

    with_daemon(tmp_path, body, runner=ScriptedRunner({JOB_COMMAND: next_answer}))


def test_alert_rules_in_the_docs_pass_promtool() -> None:
    """prometheus/sshadapter.rules.yml, which docs/metrics.md shows, is valid for promtool."""
    root = Path(__file__).resolve().parents[1]
    checked = subprocess.run(
        [promtool(), "check", "rules", str(root / "prometheus" / "sshadapter.rules.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout
    shown = (root / "docs" / "metrics.md").read_text()
    for line in (root / "prometheus" / "sshadapter.rules.yml").read_text().splitlines():
        if (
            line.strip().startswith("expr: sum by (tool, stage")
            or "histogram_quantile" in line
            or "by (host, reason) (rate(" in line
        ):
            assert line.split("expr: ", 1)[1] in shown, line


def check_with_promtool(text: str) -> None:
    checked = subprocess.run(
        [promtool(), "check", "metrics"], input=text, text=True, capture_output=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connect_failures_are_counted_by_host_and_reason(tmp_path: Path) -> None:
    """The production SSH runner of `assemble`, a host that refuses: connect_failures counts it."""
    host = HostSection(
        address="127.0.0.1",
        port=closed_port(),
        user="nobody",
        client_keys=(tmp_path / "key",),
        known_hosts=tmp_path / "known_hosts",
    )
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(tmp_path / "key")
    (tmp_path / "known_hosts").write_text("")

    async def body(d: Running) -> None:
        answer = await d.ask(LOAD)
        assert answer["error"] == {"code": "UPSTREAM_UNAVAILABLE", "retryable": True}
        text = d.service.metrics.exposition().decode()
        line = next(
            line
            for line in text.splitlines()
            if line.startswith(
                'sshadapter_ssh_connect_failures_total{host="local",reason="connect_refused"}'
            )
        )
        assert float(line.rsplit(" ", 1)[1]) >= 1
        check_with_promtool(text)

    with_daemon(tmp_path, body, ssh=True, hosts={"ci": host, "local": host})


def test_audit_write_failures_are_counted(tmp_path: Path) -> None:
    """A result record that cannot be written: INTERNAL, and audit_write_failures_total is 1."""
    holder: dict[str, Running] = {}

    async def close_audit_then_answer() -> RunResult:
        holder["d"].service.audit.close()
        return RunResult(orjson.dumps(JOB_OUT), b"", 0)

    async def body(d: Running) -> None:
        holder["d"] = d
        assert (await d.ask(CALL))["error"]["code"] == "INTERNAL"
        text = d.service.metrics.exposition().decode()
        assert "sshadapter_audit_write_failures_total 1.0" in text
        check_with_promtool(text)

    with_daemon(tmp_path, body, runner=ScriptedRunner({JOB_COMMAND: close_audit_then_answer}))


def test_reloads_are_counted_by_result(tmp_path: Path) -> None:
    """SIGHUP's reload: one that loads and one refused (a broken file) are each counted."""
    commands = shipped_commands(tmp_path)

    async def body(d: Running) -> None:
        d.daemon.reload()
        (commands / "broken.toml").write_text("version = ")
        d.daemon.reload()
        text = d.service.metrics.exposition().decode()
        assert 'sshadapter_reloads_total{result="success"} 1.0' in text
        assert 'sshadapter_reloads_total{result="failure"} 1.0' in text
        assert (await d.ask(CALL))["outcome"] == "success"  # the previous set still serves
        check_with_promtool(text)

    with_daemon(tmp_path, body, commands=commands)
