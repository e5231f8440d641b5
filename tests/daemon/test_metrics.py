"""Prometheus metrics: finite labels, expected counts, and an exposition promtool accepts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import tomllib
from pathlib import Path
from typing import Final

import asyncssh
import orjson
import pytest
from daemon_harness import JOB_COMMAND, JOB_OUT, ROOT, Running, shipped_commands, with_daemon
from fleet_sshd import fleet_address
from sshd import running_sshd, write_known_hosts
from test_fanout import on_fleet, operator_files, run_on

from sshadapter.config import HostSection, PoolSection
from sshadapter.daemon.metrics import CALL_OUTCOMES, Metrics
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

RULES = ROOT / "prometheus" / "sshadapter.rules.yml"
RULE_TESTS = ROOT / "prometheus" / "sshadapter.rules.test.yml"
DASHBOARD = ROOT / "prometheus" / "grafana-dashboard.json"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
# Alerts link to their runbook on the project's site: a notification is read away from a checkout.
RUNBOOK_URL: Final = (
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Source"]
    + "/blob/main/docs/runbooks.md#"
)
# Rules in prometheus/sshadapter.rules.yml: 3 recording rules and 10 alerts.
RULE_COUNT: Final = 13
# Metrics the dashboard may name besides the daemon's: Prometheus's own scrape status.
PROMETHEUS_METRICS: Final = frozenset({"up"})
_RULE = re.compile(r"^ +- (alert|record): (\S+)$", re.M)
_RUNBOOK = re.compile(r'^ +runbook_url: "([^"]+)"$', re.M)
_CASE = re.compile(r"alertname: (\w+)\n +exp_alerts:( \[\])?")
_METRIC_NAME = re.compile(r"\b((?:sshadapter|process)_[a-z_]+|up)\b(?!\s*[=(])")
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
    root = Path(__file__).resolve().parents[2]
    checked = subprocess.run(
        [promtool(), "check", "rules", str(root / "prometheus" / "sshadapter.rules.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {RULE_COUNT} rules found" in checked.stdout
    shown = (root / "docs" / "metrics.md").read_text()
    for line in (root / "prometheus" / "sshadapter.rules.yml").read_text().splitlines():
        if (
            line.strip().startswith("expr: sum by (tool, stage")
            or "histogram_quantile" in line
            or "by (reason) (rate(sshadapter_ssh" in line
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


def test_connect_failures_are_counted_by_reason(tmp_path: Path) -> None:
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
            if line.startswith('sshadapter_ssh_connect_failures_total{reason="connect_refused"}')
        )
        assert float(line.rsplit(" ", 1)[1]) >= 1
        check_with_promtool(text)

    with_daemon(tmp_path, body, ssh=True, hosts={"ci": host, "local": host})


def unreachable_hosts(tmp_path: Path, count: int) -> dict[str, HostSection]:
    """``count`` aliases h000, h001, ... on fleet addresses at a port where nothing listens."""
    key = tmp_path / "key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(key)
    (tmp_path / "known_hosts").write_text("")
    port = closed_port()
    return {
        f"h{i:03d}": HostSection(
            address=fleet_address(i),
            port=port,
            user="nobody",
            client_keys=(key,),
            known_hosts=tmp_path / "known_hosts",
        )
        for i in range(count)
    }


def test_a_fan_out_to_unreachable_hosts_leaves_counts_by_reason_and_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """200 hosts where nothing listens: no series per host, a count by reason, one log line."""
    commands, schemas = operator_files(tmp_path)
    hosts = unreachable_hosts(tmp_path, 200)
    scraped: list[str] = []

    async def body(d: Running) -> None:
        answer = await d.ask(run_on("fleet"))
        assert answer["data"]["failures_by_code"] == {"UPSTREAM_UNAVAILABLE": 200}
        scraped.extend(d.service.metrics.exposition().decode().splitlines())

    on_fleet(tmp_path, body, None, hosts, commands, schemas, ssh=True)
    assert [line for line in scraped if 'host="' in line] == []
    refused = next(
        line
        for line in scraped
        if line.startswith('sshadapter_ssh_connect_failures_total{reason="connect_refused"}')
    )
    assert float(refused.rsplit(" ", 1)[1]) >= 200
    check_with_promtool("\n".join(scraped) + "\n")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings[:3]
    assert "fleet_state on fleet: 200 of 200 hosts failed: UPSTREAM_UNAVAILABLE=200" in warnings[0]


def test_warm_hosts_not_reached_at_start_are_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """[pool] warm naming 50 hosts where nothing listens: one WARNING with the count by reason."""
    hosts = unreachable_hosts(tmp_path, 50)
    hosts |= {"ci": hosts["h000"], "local": hosts["h000"]}

    def reach_warnings() -> list[str]:  # the server's and the runner's, not the loader's
        named = ("sshadapter.daemon.server", "sshadapter.runners")
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith(named)
        ]

    async def body(d: Running) -> None:
        for _ in range(500):  # the warming is in the background: wait for its line
            if reach_warnings():
                break
            await asyncio.sleep(0.02)

    warm = PoolSection(warm=tuple(f"h{i:03d}" for i in range(50)))
    with_daemon(tmp_path, body, ssh=True, hosts=hosts, pool=warm)
    assert reach_warnings() == [
        "50 of 50 warm hosts not reachable yet (the first call tries again): connect_refused=50"
    ]


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


def alert_runbooks() -> dict[str, str | None]:
    """Each alert of the rules file, and its runbook_url (None when it has none)."""
    text = RULES.read_text()
    rules = list(_RULE.finditer(text))
    found: dict[str, str | None] = {}
    for rule, following in zip(rules, [*rules[1:], None], strict=True):
        if rule[1] == "alert":
            block = text[rule.end() : following.start() if following else len(text)]
            runbook = _RUNBOOK.search(block)
            found[rule[2]] = runbook[1] if runbook else None
    return found


def test_every_alert_fires_on_its_scenario_and_stays_silent_otherwise() -> None:
    """promtool test rules passes, with a firing and a silent case for every alert."""
    checked = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    cases = _CASE.findall(RULE_TESTS.read_text())
    firing = {name for name, empty in cases if not empty}
    silent = {name for name, empty in cases if empty}
    assert firing == silent == set(alert_runbooks())
    assert len(alert_runbooks()) == 10


def test_every_alert_has_a_runbook_section_in_the_docs() -> None:
    """Each alert links to docs/runbooks.md#its-name on the project's site: a heading, a row."""
    headings = re.findall(r"^## (\S+)$", RUNBOOKS.read_text(), re.M)
    table = (ROOT / "docs" / "metrics.md").read_text()
    for alert, runbook in alert_runbooks().items():
        assert runbook == f"{RUNBOOK_URL}{alert.lower()}", alert
        assert alert in headings, alert
        assert f"| `{alert}` |" in table, alert
    assert sorted(headings) == sorted(alert_runbooks())


def test_known_label_sets_start_at_zero_and_process_metrics_are_exported(tmp_path: Path) -> None:
    """Every tool's calls_total and both reload results read 0 at start, and after a reload."""
    commands = shipped_commands(tmp_path)

    async def body(d: Running) -> None:
        text = d.service.metrics.exposition().decode()
        for tool in [*d.service.tool_names, "sshadapter"]:
            for outcome, code in CALL_OUTCOMES:
                line = f'sshadapter_calls_total{{code="{code}",outcome="{outcome}",tool="{tool}"}}'
                assert f"{line} 0.0" in text, line
        assert 'sshadapter_reloads_total{result="failure"} 0.0' in text
        assert "process_start_time_seconds " in text
        assert "process_resident_memory_bytes " in text
        (commands / "load_average_copy.toml").write_text(
            (commands / "load_average.toml").read_text()
        )
        d.daemon.reload()
        assert "load_average_copy" in d.service.tool_names
        text = d.service.metrics.exposition().decode()
        assert (
            'sshadapter_calls_total{code="INVALID_RESPONSE",outcome="failure",'
            'tool="load_average_copy"} 0.0' in text
        )
        check_with_promtool(text)

    with_daemon(tmp_path, body, commands=commands)


def test_a_first_host_key_mismatch_scraped_from_the_daemon_fires_the_alert(tmp_path: Path) -> None:
    """A real sshd's changed host key: its series goes from 0 to 1, and promtool fires the alert."""
    with running_sshd() as sshd:
        other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
        known = write_known_hosts(tmp_path / "known_hosts", sshd.address, sshd.port, other)
        host = HostSection(
            address=sshd.address,
            port=sshd.port,
            user=sshd.user,
            client_keys=(sshd.client_key,),
            known_hosts=known,
        )
        scraped: list[str] = []

        async def body(d: Running) -> None:
            before = d.service.metrics.exposition().decode()
            assert f"{MISMATCH} 0.0" in before.splitlines()
            answer = await d.ask(LOAD)
            assert answer["error"] == {"code": "UPSTREAM_UNAVAILABLE", "retryable": False}
            scraped.extend(
                line
                for line in d.service.metrics.exposition().decode().splitlines()
                if line.startswith(MISMATCH)
            )

        with_daemon(tmp_path, body, ssh=True, hosts={"ci": host, "local": host})
    assert scraped == [f"{MISMATCH} 1.0"]
    series, value = scraped[0].rsplit(" ", 1)
    (tmp_path / "rules.yml").write_text(RULES.read_text())
    (tmp_path / "scrape.test.yml").write_text(
        json.dumps(  # JSON is YAML: one scrape before the failure, then the daemon's own
            {
                "rule_files": ["rules.yml"],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [{"series": series, "values": f"0x5 {value}x10"}],
                        "alert_rule_test": [
                            {"eval_time": "4m", "alertname": ALERT, "exp_alerts": []},
                            {
                                "eval_time": "6m",
                                "alertname": ALERT,
                                "exp_alerts": [
                                    {
                                        "exp_labels": {
                                            "severity": "critical",
                                            "reason": "host_key_mismatch",
                                        },
                                        "exp_annotations": {
                                            "summary": "sshadapter cannot authenticate to "
                                            "a host (host_key_mismatch): the audit names it",
                                            "runbook_url": RUNBOOK_URL
                                            + "sshadapterhostkeyorauthfailure",
                                        },
                                    }
                                ],
                            },
                        ],
                    }
                ],
            }
        )
    )
    checked = subprocess.run(
        [promtool(), "test", "rules", "scrape.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


ALERT = "SshadapterHostKeyOrAuthFailure"
MISMATCH = 'sshadapter_ssh_connect_failures_total{reason="host_key_mismatch"}'


def dashboard_expressions() -> list[str]:
    """Every PromQL expression of the Grafana dashboard, panel by panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def exported_names() -> set[str]:
    """Every sample name the daemon's registry exports (as docs/metrics.md lists them)."""
    metrics = Metrics()
    metrics.watch_connections(dict)
    metrics.watch_credentials(dict)
    metrics.watch_tunnels(dict)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_every_dashboard_expression_passes_promtool_and_names_exported_metrics(
    tmp_path: Path,
) -> None:
    """Each dashboard query passes promtool and names only metrics the daemon exports (or up)."""
    expressions = dashboard_expressions()
    assert len(expressions) == 30
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text(
        json.dumps(
            {
                "groups": [
                    {
                        "name": "dashboard",
                        "rules": [
                            {"record": f"dashboard:query{i}", "expr": expr}
                            for i, expr in enumerate(expressions)
                        ],
                    }
                ]
            }
        )
    )
    checked = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in checked.stdout
    known = exported_names() | PROMETHEUS_METRICS
    named = {name for expr in expressions for name in _METRIC_NAME.findall(expr)}
    assert named - known == set()
    daemon = {name for name in named if name.startswith("sshadapter_")}
    assert len(daemon) >= 20  # the pattern still finds them


def test_the_dashboard_shows_one_job_and_the_instances_chosen() -> None:
    """Its job and instance variables scope every series of every query (several daemons)."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= set(variables)
    assert "sshadapter_build_info" in variables["job"]["definition"]
    assert '{job="$job"}' in variables["instance"]["definition"]
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    scoped = r'\{job="\$job", instance=~"\$instance"'
    selected = re.compile(r"\b(?:(?:sshadapter|process)_[a-z_]+|up)" + scoped)
    for expr in dashboard_expressions():
        assert len(selected.findall(expr)) == len(_METRIC_NAME.findall(expr)) > 0, expr
