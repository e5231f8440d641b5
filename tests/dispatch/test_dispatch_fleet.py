"""Dispatch hosts at fleet scale: one policy per group, drift checked lazily, bounded checks.

A group's policy is one document every member installs (``sshadapter policy
GROUP``), refused when the members run different operations; the daemon
finds a member that installed it current. The policy monitor checks a host
when a connection opens and only while one stays open, through a scripted
runner that plays the host with the real dispatcher's answers and says which
hosts are connected (tests/dispatch/test_dispatch_sshd.py repeats the group through a
real sshd and the real dispatcher).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from dispatch_support import ROOT, open_commands, policy_without

from sshadapter.cli import main as cli_main
from sshadapter.config import Config, load_config
from sshadapter.contract.registry import load_registry
from sshadapter.daemon.drift import (
    MAX_CHECKS_IN_FLIGHT,
    RECHECK_AFTER_REFUSAL_SECONDS,
    PolicyMonitor,
    check_hosts,
    compare,
)
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.server import load
from sshadapter.dispatch import dispatcher, policy
from sshadapter.errors import ConfigError
from sshadapter.inventory.fleet import Inventory
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

WEB = ("web-1", "web-2", "web-3")
SHIPPED = load_registry(ROOT / "commands", ROOT / "schemas", hosts=None)
PROBE = SHIPPED.operations["load_average"]


def document(name: str, *operations: str) -> dict[str, Any]:
    """A sealed policy document named ``name`` with these (one-word) operations."""
    entries = {op: {"argv": [op], "params": {}} for op in operations}
    body = {"format": policy.POLICY_FORMAT, "host": name, "operations": entries}
    return {**body, "digest": policy.digest(body)}


def fleet_commands(target: Path) -> Path:
    """The shipped operations of `local` on the group `web` instead (the ci ones left out)."""
    commands = open_commands(target)
    for path in commands.glob("*.toml"):
        text = path.read_text()
        if 'host = "ci"' in text:
            path.unlink()
        else:
            path.write_text(text.replace('host = "local"', 'targets = ["web"]'))
    return commands


def fleet_config(tmp_path: Path, hosts: str = "") -> Path:
    """A configuration with three dispatch hosts in the group `web` (and ``hosts``)."""
    config = tmp_path / "config.toml"
    members = "".join(
        f'[hosts.{alias}]\naddress = "10.0.0.{n}"\nlabels = {{ role = "web" }}\n\n'
        for n, alias in enumerate(WEB, 1)
    )
    config.write_text(
        f'[paths]\ncommands = "{fleet_commands(tmp_path / "commands")}"\n'
        f'schemas = "{ROOT / "schemas"}"\n\n'
        '[host_defaults]\nuser = "sshadapter"\nknown_hosts = "/etc/ssh/ssh_known_hosts"\n'
        "dispatch = true\n\n"
        f'{members}{hosts}[groups.web]\nmatch = {{ role = "web" }}\n'
    )
    return config


def printed_policy(config: Path, target: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_main(["policy", target, "--config", str(config)]) == 0
    return capsys.readouterr().out


def answer(document: Mapping[str, Any]) -> RunResult:
    """What the host's dispatcher prints for the digest command, for this policy."""
    return RunResult(dispatcher.digest_answer(document), b"", 0)


class Fleet(ScriptedRunner):
    """A scripted runner whose hosts in ``open`` count as connected (``connections()``, as
    SshRunner's), and that remembers which host each command went to."""

    def __init__(self, table: Mapping[str, Any]) -> None:
        super().__init__(table)
        self.open: set[str] = set()
        self.asked: list[str] = []
        """The host of each digest command, in order."""

    async def run(
        self, host: str, command: str, *, timeout: float, max_stdout: int, max_stderr: int
    ) -> RunResult:
        if command == policy.DIGEST_COMMAND:
            self.asked.append(host)
        return await super().run(
            host, command, timeout=timeout, max_stdout=max_stdout, max_stderr=max_stderr
        )

    def connections(self) -> dict[str, int]:
        return dict.fromkeys(self.open, 1)


def monitor_of(runner: Fleet, clock: list[float], policies: Mapping[str, Any]) -> PolicyMonitor:
    open_hosts = lambda: [a for a, n in runner.connections().items() if n]  # noqa: E731
    monitor = PolicyMonitor(runner, Metrics(), clock=lambda: clock[0], open_hosts=open_hosts)
    monitor.expect(policies)
    return monitor


async def settled(monitor: PolicyMonitor) -> None:
    """Until the background checks spawned so far are done."""
    for _ in range(50):
        await asyncio.sleep(0)
    await monitor.close()


# One policy per group ---------------------------------------------------------------------


def test_a_groups_policy_is_one_document_its_members_each_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`policy web`: the same bytes every time, named `web`; each member's operations exactly."""
    config = fleet_config(tmp_path)
    printed = printed_policy(config, "web", capsys)
    assert printed_policy(config, "web", capsys) == printed
    document = json.loads(printed)
    body = {k: v for k, v in document.items() if k != "digest"}
    assert document["host"] == "web" and document["digest"] == policy.digest(body)
    assert len(document["operations"]) == 4  # disk_usage, load_average, mount_info, service_state
    loaded = load(load_config(config)[0])
    for alias in WEB:
        own = json.loads(printed_policy(config, alias, capsys))
        assert own["host"] == alias and own["operations"] == document["operations"]
        expected = loaded.policies[alias]
        assert policy.operation_digests(expected) == policy.operation_digests(document)
        state = compare(expected, answer(document))  # the daemon's view of a member
        assert (state.result, state.drifted, state.detail) == (
            "current",
            frozenset(),
            "installed as 'web'",
        )
    behind = compare(loaded.policies["web-1"], answer(policy_without(document, "mount_info")))
    assert (behind.result, set(behind.drifted)) == ("drift", {"mount_info"})


def test_a_group_whose_members_run_different_operations_has_no_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One member with one more operation: refused, naming both members and the difference."""
    config = fleet_config(tmp_path)
    commands = tmp_path / "commands"
    extra = (commands / "load_average.toml").read_text()
    extra = extra.replace('targets = ["web"]', 'host = "web-2"').replace(
        '"/proc/loadavg"', '"/proc/loadavg-web2"'
    )
    (commands / "load_extra.toml").write_text(extra)
    assert cli_main(["policy", "web", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert len(error.splitlines()) == 1 and str(config) in error and "groups.web" in error
    assert "members 'web-1' and 'web-2' run different operations" in error
    assert "(web-1 only: -; web-2 only: load_extra)" in error and "split the group" in error
    own = json.loads(printed_policy(config, "web-2", capsys))  # per host still works
    assert "load_extra" in own["operations"] and own["host"] == "web-2"
    assert cli_main(["policy", "nosuch", "--config", str(config)]) == 2
    assert "no such host alias or group" in capsys.readouterr().err


def test_a_thousand_members_share_one_checked_set_of_operations(tmp_path: Path) -> None:
    """1,000 dispatch hosts of one group: one `operations` mapping, built and checked once."""
    aliases = tuple(f"h{n:04d}" for n in range(1000))
    commands = fleet_commands(tmp_path / "commands")
    registry = load_registry(
        commands,
        ROOT / "schemas",
        hosts=aliases,
        dispatch_hosts=aliases,
        groups=["web"],
        dispatch_groups=["web"],
    )
    inventory = Inventory(dict.fromkeys(aliases), {"web": aliases}, {})  # type: ignore[arg-type]
    documents = policy.host_policies(registry, inventory)
    assert sorted(documents) == list(aliases)
    shared = documents["h0000"]["operations"]
    assert all(d["operations"] is shared for d in documents.values())
    for alias in ("h0000", "h0999"):
        body = {k: v for k, v in documents[alias].items() if k != "digest"}
        assert documents[alias]["digest"] == policy.digest(body)
    group = policy.group_policy("web", registry, inventory)
    assert group["operations"] == shared and group["host"] == "web"


# Drift, lazily ----------------------------------------------------------------------------


def test_drift_is_checked_on_connect_and_rechecked_only_while_connected() -> None:
    """A host is asked only once connected, then every interval while connected, never after."""
    policies = {alias: document(alias, "load_average") for alias in WEB}
    runner = Fleet({policy.DIGEST_COMMAND: answer(document("web", "load_average"))})
    clock = [1000.0]
    monitor = monitor_of(runner, clock, policies)

    async def body() -> None:
        watch = asyncio.create_task(monitor.watch(interval=60.0, tick=0.005))
        await asyncio.sleep(0.05)
        assert runner.asked == [] and monitor.state("web-1") is None  # no connection, no exec
        runner.open.add("web-1")
        monitor.connected("web-1")
        monitor.connected("web-1")  # the check's own connect: one check
        await asyncio.sleep(0.05)
        assert runner.asked == ["web-1"]
        state = monitor.state("web-1")
        assert state is not None and state.result == "current"
        clock[0] += 30.0
        await asyncio.sleep(0.05)
        assert runner.asked == ["web-1"]  # not due yet
        clock[0] += 30.0
        await asyncio.sleep(0.05)
        assert runner.asked == ["web-1", "web-1"]  # due, and still connected
        runner.open.discard("web-1")
        clock[0] += 600.0
        await asyncio.sleep(0.05)
        assert runner.asked == ["web-1", "web-1"]  # closed: never asked on the timer
        monitor.connected("nosuch")  # no dispatch host: nothing to ask
        await asyncio.sleep(0.01)
        assert runner.asked == ["web-1", "web-1"] and monitor.state("web-2") is None
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await monitor.close()

    asyncio.run(body())


def test_a_reload_rechecks_connected_hosts_and_forgets_the_others() -> None:
    """Both hosts drifted; a reload asks the connected one again, the other waits for a call."""
    named = document("web", "load_average")
    policies = {alias: document(alias, "load_average") for alias in ("web-1", "web-2")}
    runner = Fleet({policy.DIGEST_COMMAND: answer(document("web"))})
    clock = [1000.0]
    monitor = monitor_of(runner, clock, policies)

    def result(alias: str) -> str | None:
        state = monitor.state(alias)
        return None if state is None else state.result

    async def body() -> None:
        await monitor.check_many(["web-1", "web-2"])
        assert (result("web-1"), result("web-2")) == ("drift", "drift")
        runner.open.add("web-1")
        runner.table[policy.DIGEST_COMMAND] = answer(named)  # both hosts updated by hand
        clock[0] += 1.0
        monitor.expect(policies)  # a reload
        monitor.check_soon()
        await settled(monitor)
        assert runner.asked == ["web-1", "web-2", "web-1"]
        assert (result("web-1"), result("web-2")) == ("current", None)  # web-2: not held back

        # A state kept while the connection closed: a refused call asks again, which connects.
        runner.table[policy.DIGEST_COMMAND] = answer(document("web"))
        await monitor.check("web-1")
        runner.open.clear()
        runner.table[policy.DIGEST_COMMAND] = answer(named)
        assert monitor.refusal(PROBE, "web-1") is not None
        await settled(monitor)
        assert runner.asked[-1] == "web-1" and len(runner.asked) == 4  # just checked: no more
        clock[0] += RECHECK_AFTER_REFUSAL_SECONDS
        assert monitor.refusal(PROBE, "web-1") is not None
        await settled(monitor)
        assert len(runner.asked) == 5 and monitor.refusal(PROBE, "web-1") is None

    asyncio.run(body())


# check --hosts, bounded ---------------------------------------------------------------------


def test_check_hosts_asks_only_the_groups_members_a_bounded_number_at_once() -> None:
    """100 of 150 hosts asked, never more than MAX_CHECKS_IN_FLIGHT (or the bound given) at once."""
    web = document("web", "load_average")
    aliases = [f"h{n:03d}" for n in range(150)]
    policies = {alias: document(alias, "load_average") for alias in aliases}
    in_flight, peak = [0], [0]

    async def slow() -> RunResult:
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        return answer(web)

    for bound in (MAX_CHECKS_IN_FLIGHT, 8):
        runner = Fleet({policy.DIGEST_COMMAND: slow})
        peak[0] = 0
        reports = asyncio.run(
            check_hosts(Config(), policies, hosts=aliases[:100], runner=runner, max_in_flight=bound)
        )
        assert [r.host for r in reports] == aliases[:100] and all(r.ok for r in reports)
        assert sorted(runner.asked) == aliases[:100]
        assert peak[0] == bound


def test_check_target_needs_hosts_and_a_target_with_dispatch_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--target` without `--hosts`, an unknown target, one without dispatch hosts: usage errors."""
    config = fleet_config(tmp_path, '[hosts.plain]\naddress = "10.0.1.1"\ndispatch = false\n\n')
    base = ["check", "--config", str(config)]
    assert cli_main([*base, "--target", "web"]) == 2
    assert "give both" in capsys.readouterr().err
    assert cli_main([*base, "--hosts", "--target", "nosuch"]) == 2
    assert "'nosuch' is no host alias and no group" in capsys.readouterr().err
    assert cli_main([*base, "--hosts", "--target", "plain"]) == 2
    assert "'plain' has no dispatch host" in capsys.readouterr().err


def test_a_groups_policy_error_is_a_config_error() -> None:
    """group_policy raises ConfigError (file, key, reason), never anything else."""
    registry = load_registry(
        ROOT / "commands", ROOT / "schemas", hosts=("ci", "local"), dispatch_hosts=("ci",)
    )
    inventory = Inventory(dict.fromkeys(("ci", "local")), {"both": ("ci", "local")}, {})  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        policy.group_policy("both", registry, inventory)
    assert caught.value.key == "groups.both" and "'ci' and 'local'" in caught.value.reason
