"""`sshadapter demo`, the README's first command: no root, no sshd, no configuration needed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sshadapter.demo import FLEET_GROUP, FLEET_MAX_RESULTS, FLEET_TOOL
from sshadapter.demo_hosts import FLEET_BANNER_HOST, FLEET_LOADS

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoRun:
    """One run of `sshadapter demo`, shared by the tests that read its output."""

    done: subprocess.CompletedProcess[str]
    lines: list[str]
    envelopes: dict[str, Any]
    """Each `$ sshadapter call ...` line (without the prefix) -> the envelope printed after it."""
    left_behind: set[Path]


@pytest.fixture(scope="module")
def demo() -> DemoRun:
    before = set(Path(tempfile.gettempdir()).glob("sshadapter-demo-*"))
    done = subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    after = set(Path(tempfile.gettempdir()).glob("sshadapter-demo-*"))
    lines = done.stdout.splitlines()
    envelopes = {}
    for number, command in enumerate(lines):
        if command.startswith("$ sshadapter call "):
            envelopes[command.removeprefix("$ sshadapter call ")] = _json_from(lines, number + 1)
    return DemoRun(done, lines, envelopes, after - before)


def _json_from(lines: list[str], start: int) -> Any:
    """The JSON value printed from ``lines[start]`` on, on one line or several."""
    for end in range(start + 1, len(lines) + 1):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads("\n".join(lines[start:end]))
    raise AssertionError(f"no JSON after {lines[start - 1]!r}")


def test_demo_shows_accepted_and_rejected_results_and_cleans_up(demo: DemoRun) -> None:
    """The demo shows envelopes, a refused stolen key, counters and an MCP session, then cleans up.

    Envelopes for real and scripted calls, a stolen key refused by the dispatcher next to an
    allowed command, the counters, an MCP session listing every shipped tool; nothing is left
    behind.
    """
    done, lines, envelopes = demo.done, demo.lines, demo.envelopes
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert envelopes["load_average "]["outcome"] == "success"
    assert envelopes["disk_usage path=/"]["data"]["mounted_on"] == "/"
    assert envelopes["job_run_status project_id=bluebird"]["outcome"] == "success"
    assert "log_tail" not in envelopes["job_run_status project_id=bluebird"]["data"]
    banner = envelopes["deploy_status environment=staging"]
    assert banner["error"] == {"code": "INVALID_RESPONSE", "retryable": False}
    assert "production" not in json.dumps(banner)  # the banner's instruction never gets out
    assert envelopes["run_shell command=id"]["tool"] == "sshadapter"
    assert (
        'sshadapter_rejections_total{reason="schema_mismatch",stage="schema",'
        'tool="deploy_status"} 1.0'
    ) in done.stdout
    # A stolen key on `local` (behind sshadapter-dispatch): refused and logged; the daemon's
    # own command runs.
    refused = lines.index("$ ssh local 'cat /proc/loadavg; id'")
    assert lines[refused + 1].startswith("sshadapter-dispatch: refused (not_canonical) sha256:")
    assert lines[refused + 2] == "exit status 77"
    assert "refused reason=not_canonical" in lines[refused + 3]
    allowed = lines.index("$ ssh local 'cat /proc/loadavg'")
    assert lines[allowed + 1].count(" ") == 4 and lines[allowed + 2] == "exit status 0"
    assert "allowed operation=load_average" in lines[allowed + 3]
    assert 'sshadapter_dispatch_policy_checks_total{host="local",result="current"}' in done.stdout
    # The MCP session: requests as a host writes them, what it gets back.
    requests = [json.loads(line[2:]) for line in lines if line.startswith("> ")]
    assert [r["method"] for r in requests] == [
        "initialize",
        "tools/list",
        "tools/call",
        "tools/call",
    ]
    answers = [line[2:] for line in lines if line.startswith("< ")]
    # Every shipped operation, and the demo's own fan-out over its fleet.
    shipped = sorted([*(path.stem for path in (ROOT / "commands").glob("*.toml")), FLEET_TOOL])
    listed = f"{len(shipped)} tools, each with its input and output schema: "
    assert answers[1].startswith(listed), answers[1]
    names = answers[1].removeprefix(listed).replace(" (read-only)", "").split(", ")
    assert sorted(names) == shipped  # whatever their number
    success, failure = (json.loads(a.split(": ", 1)[1]) for a in answers[2:])
    assert answers[2].startswith("isError false") and success["outcome"] == "success"
    assert answers[3].startswith("isError true")
    assert failure["error"] == {"code": "INVALID_RESPONSE", "retryable": False}
    assert not demo.left_behind


def test_the_demo_fans_out_over_its_group_and_one_host_fails_alone(demo: DemoRun) -> None:
    """A call on demo-fleet: the banner host fails alone, the rest answer, all are audited."""
    assert demo.done.returncode == 0, demo.done.stderr
    fanout = demo.envelopes[f"{FLEET_TOOL} run_on={FLEET_GROUP}"]
    assert fanout["outcome"] == "success"
    data = fanout["data"]
    hosts = sorted(FLEET_LOADS)
    assert {k: v for k, v in data.items() if k != "results"} == {
        "target": FLEET_GROUP,
        "hosts": len(hosts),
        "succeeded": len(hosts) - 1,
        "failed": 1,
        "omitted": len(hosts) - FLEET_MAX_RESULTS,
        "failures_by_code": {"INVALID_RESPONSE": 1},
    }
    # Failures first, then successes by alias, up to the cap; the banner never gets out.
    assert [(e["host"], e["outcome"]) for e in data["results"]] == [
        (FLEET_BANNER_HOST, "failure"),
        *[(h, "success") for h in hosts if h != FLEET_BANNER_HOST][: FLEET_MAX_RESULTS - 1],
    ]
    assert data["results"][0]["error"] == {"code": "INVALID_RESPONSE", "retryable": False}
    assert data["results"][1]["data"] == {
        "load1": 0.12,
        "load5": 0.2,
        "load15": 0.18,
        "running": 1,
        "total": 211,
    }
    assert "iptables" not in json.dumps(fanout)
    # The operator's audit record: a row for every host, the cap does not apply there.
    call = demo.lines.index(f"$ sshadapter call {FLEET_TOOL} run_on={FLEET_GROUP}")
    rows = next(
        n for n in range(call, len(demo.lines)) if demo.lines[n].startswith("  operator's audit")
    )
    assert demo.lines[rows].startswith(f"  operator's audit record: {len(hosts)} hosts ")
    shown = [line.split() for line in demo.lines[rows + 1 : rows + 1 + len(hosts)]]
    assert [(row[0], row[1]) for row in shown] == [
        (h, "failure" if h == FLEET_BANNER_HOST else "success") for h in hosts
    ]
    banner = shown[hosts.index(FLEET_BANNER_HOST)]
    assert banner[2:4] == ["INVALID_RESPONSE", "extract/unmatched_line:"]
    assert banner[-1].endswith(f".{FLEET_BANNER_HOST}.1.stdout")  # its bytes kept, for review
    # Outside the closed set: a listed-nowhere host and a name that exists nowhere, one answer.
    refused = [demo.envelopes[f"{FLEET_TOOL} run_on={name}"] for name in ("ci", "db-1")]
    for envelope in refused:
        assert envelope["error"] == {
            "code": "INVALID_REQUEST",
            "retryable": False,
            "hint": {"parameter": "run_on", "rule": "choice"},
        }
    assert [{k: v for k, v in e.items() if k != "request_id"} for e in refused] == [
        {"tool": FLEET_TOOL, "outcome": "failure", "error": refused[0]["error"]}
    ] * 2


def test_the_demo_without_the_examples_says_so_in_one_line(tmp_path: Path) -> None:
    """Installed without the checkout's commands/ and schemas/, the demo says where it looked."""
    shutil.copytree(ROOT / "sshadapter", tmp_path / "pkg" / "sshadapter")
    code = "import sys; from sshadapter.cli import main; sys.exit(main(['demo']))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "pkg")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("sshadapter demo: no commands/ and schemas/ in ")
    assert len(done.stderr.strip().splitlines()) == 1
