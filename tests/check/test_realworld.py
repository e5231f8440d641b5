"""The shipped operations against real outputs of their commands, collected from other projects.

``../shared/realworld/`` (its README.md says how it was made) holds 192 outputs of
``cat /proc/loadavg``, ``df -P -k``, ``findmnt -J`` and ``systemctl show`` from other
projects' corpora and issue reports (AIX, the BSDs, Solaris, BusyBox, several Linux
distributions, a German locale, CIFS and NFS shares), each as a fixture in this
project's layout, and ``fixtures.json`` with the judgement a careful operator expects:
a legitimate output accepted with exactly the data a person reads from it, the output
of another command or flag set rejected. They are other projects' data under their own
terms, so they are read from there and never copied here. Found like the JSONTestSuite
corpus (SSHADAPTER_SHARED, else shared/ beside the repository); when it is missing the
tests skip, and fail when $CI says it must be there.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pytest
from shared_data import find_shared, require_shared

from sshadapter.check.fixtures import Fixture, load_fixtures
from sshadapter.check.nearmiss import derive
from sshadapter.contract.evaluate import Verdict, evaluate, seal
from sshadapter.contract.registry import Operation, Registry, load_registry
from sshadapter.runners.interface import RunResult

ROOT = Path(__file__).resolve().parents[2]
SUBDIR: Final = Path("realworld")
FIXTURE_COUNT: Final = 192  # fixtures.json as collected; fewer means a truncated copy
# The one header GNU df -P -k prints under the POSIX locale the disk_usage argv pins.
POSIX_DF_HEADER: Final = b"Filesystem     1024-blocks      Used Available Capacity Mounted on\n"
REQUEST_ID: Final = "req.realworld0"
# Derived from the 162 accepted cases when this was written (1,334): fewer means derive()
# or the collection lost cases, and the test below would prove less than it says.
MIN_NEAR_MISSES: Final = 1334
REALWORLD = find_shared(SUBDIR)
MISSING = "realworld-missing"


def _judgements() -> list[dict[str, Any]]:
    if REALWORLD is None or not (REALWORLD / "fixtures.json").is_file():
        return []
    fixtures: list[dict[str, Any]] = json.loads((REALWORLD / "fixtures.json").read_bytes())[
        "fixtures"
    ]
    return fixtures


JUDGEMENTS = {f"{j['op']}/{j['case']}": j for j in _judgements()}


def require_realworld() -> Path:
    """The folder, or a skip (a fail when $CI says it must be there)."""
    return require_shared(REALWORLD, "fixtures.json")


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry(ROOT / "commands", ROOT / "schemas", hosts=None)


@pytest.fixture(scope="module")
def fixtures(registry: Registry) -> Mapping[str, tuple[Operation, Fixture]]:
    """Every real-world case, loaded through the project's own fixture loader.

    The shipped operations, each pointed at its folder under realworld/fixtures/:
    the loader refuses a case whose args fail the operation's parameter schema.
    """
    folder = require_realworld() / "fixtures"
    loaded = {}
    for name, op in registry.operations.items():
        beside = dataclasses.replace(op, file=folder / f"{name}.toml")
        for fixture in load_fixtures(beside):
            loaded[f"{name}/{fixture.case}"] = (op, fixture)
    return loaded


def verdict_of(op: Operation, fixture: Fixture, stdout: bytes) -> tuple[Verdict, dict[str, Any]]:
    """Stages 6-10 and the envelope, which must match the tool's full published schema."""
    run = RunResult(stdout, fixture.stderr, fixture.exit_status)
    verdict = evaluate(op, fixture.args, run, fixture.now)
    sealed = seal(op, REQUEST_ID, verdict)
    assert op.envelope_validator.is_valid(sealed)
    return verdict, sealed


def handled_right(right: Mapping[str, Any], verdict: Verdict, sealed: Mapping[str, Any]) -> bool:
    """fixtures.json's judgement: exact data, or a failure with the code (not) named."""
    if right["outcome"] == "success":
        return bool(sealed["outcome"] == "success" and sealed["data"] == right["data"])
    return bool(
        sealed["outcome"] == "failure"
        and right.get("code", verdict.code) == verdict.code
        and verdict.code != right.get("code_not")
        and right.get("stage", verdict.stage) == verdict.stage
    )


def under_posix_locale(stdout: bytes) -> bytes:
    """What the host prints once the argv pins LC_ALL=C: the POSIX header, the same rows.

    GNU df translates its header, never its rows (numbers, names and `%` are not
    localised by -P); POSIX fixes the C locale's header.
    """
    return POSIX_DF_HEADER + stdout.split(b"\n", 1)[1]


def test_the_collection_is_whole(fixtures: Mapping[str, tuple[Operation, Fixture]]) -> None:
    """Every fixture file has a judgement and every judgement a fixture: 192 of them."""
    assert len(JUDGEMENTS) == FIXTURE_COUNT
    assert set(fixtures) == set(JUDGEMENTS)


@pytest.mark.parametrize("name", sorted(JUDGEMENTS) or [MISSING])
def test_real_output_is_judged_as_a_careful_operator_would(
    fixtures: Mapping[str, tuple[Operation, Fixture]], name: str
) -> None:
    """Accepted with exactly the data a person reads, or rejected with the code expected."""
    assert name != MISSING, "fixtures.json has no fixtures"
    op, fixture = fixtures[name]
    right = JUDGEMENTS[name]["right"]
    if JUDGEMENTS[name]["locale"]:
        # Recorded under a translated locale, which the pinned argv rules out: the
        # translated header itself is refused, never guessed at, and the host's real
        # answer (the POSIX header over the same row) gives exactly the data.
        assert op.argv.argv({**fixture.args})[:2] == ["env", "LC_ALL=C"]
        verdict, _ = verdict_of(op, fixture, fixture.stdout)
        assert (verdict.stage, verdict.reason) == ("extract", "missing_header")
        verdict, sealed = verdict_of(op, fixture, under_posix_locale(fixture.stdout))
    else:
        verdict, sealed = verdict_of(op, fixture, fixture.stdout)
    assert handled_right(right, verdict, sealed), verdict.failure


def test_near_misses_of_every_accepted_real_output_are_rejected(
    fixtures: Mapping[str, tuple[Operation, Fixture]],
) -> None:
    """What `sshadapter check` derives (banner, trailing text, duplicated lines...) all fail."""
    accepted = [
        (op, fixture, under_posix_locale(fixture.stdout) if judged["locale"] else fixture.stdout)
        for name, (op, fixture) in fixtures.items()
        if (judged := JUDGEMENTS[name])["right"]["outcome"] == "success"
    ]
    near_misses = [
        (op, fixture, kind, stdout)
        for op, fixture, accepted_stdout in accepted
        for kind, stdout in derive(op, accepted_stdout)
    ]
    assert len(near_misses) >= MIN_NEAR_MISSES
    accepted_near_misses = [
        (op.name, fixture.case, kind)
        for op, fixture, kind, stdout in near_misses
        if verdict_of(op, fixture, stdout)[0].code != "INVALID_RESPONSE"
    ]
    assert accepted_near_misses == []


def test_the_shipped_argv_is_the_one_the_outputs_were_collected_for(registry: Registry) -> None:
    """fixtures.json's argv per operation is the shipped one, less disk_usage's locale pin."""
    argv = json.loads((require_realworld() / "fixtures.json").read_bytes())["argv"]
    for name, collected in argv.items():
        shipped = [
            "".join(f"{{{text}}}" if is_param else text for is_param, text in element.parts)
            for element in registry.operations[name].argv.elements
        ]
        assert shipped == (["env", "LC_ALL=C", *collected] if name == "disk_usage" else collected)
