"""Prometheus metrics: finite labels, expected counts, and an exposition promtool accepts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from daemon_harness import JOB_COMMAND, JOB_OUT, Running, with_daemon

from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

CALL = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}


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
    """Two accepted calls, one schema rejection, one denial: counts are exact, promtool is happy."""
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
            'sshadapter_rejections_total{reason="not_allowed",stage="authorize",'
            'tool="review_status"} 1.0',
            'sshadapter_call_duration_seconds_count{tool="job_run_status"} 3.0',
            'sshadapter_output_bytes_count{tool="job_run_status"} 3.0',
            'sshadapter_build_info{version="0.1.0"} 1.0',
        ]:
            assert line in text, line
        checked = subprocess.run(
            [promtool(), "check", "metrics"], input=text, text=True, capture_output=True, timeout=30
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr

    with_daemon(tmp_path, body, runner=ScriptedRunner({JOB_COMMAND: next_answer}))


def test_alert_rules_in_the_readme_pass_promtool() -> None:
    """prometheus/sshadapter.rules.yml, which the README shows, is valid for promtool."""
    root = Path(__file__).resolve().parents[1]
    checked = subprocess.run(
        [promtool(), "check", "rules", str(root / "prometheus" / "sshadapter.rules.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout
    readme = (root / "README.md").read_text()
    for line in (root / "prometheus" / "sshadapter.rules.yml").read_text().splitlines():
        if (
            line.strip().startswith("expr: sum by (tool, stage")
            or "histogram_quantile" in line
            or "by (host, reason) (rate(" in line
        ):
            assert line.split("expr: ", 1)[1] in readme, line
