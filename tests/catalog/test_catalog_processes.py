"""The processes family of the catalog: counts by state and a top N, never a command line."""

from __future__ import annotations

import subprocess

import pytest
from catalog_corpus import family, misses
from catalog_family import judged

TOP = "top_processes"


def test_every_fixture_and_near_miss_comes_out_as_declared() -> None:
    """`sshadapter check` over the family: every fixture as declared, every near-miss refused."""
    assert misses(family("processes")) == []


def test_this_machines_process_states_are_counted() -> None:
    """ps on this machine, run now, gives counts that add up to its total."""
    stdout = subprocess.run(["ps", "-e", "-o", "state="], capture_output=True, check=True).stdout
    _, sealed = judged(family("processes"), "process_states", stdout)
    data = sealed["data"]
    assert sum(data["counts"].values()) == data["total"] == len(stdout.splitlines())


@pytest.mark.parametrize("by", ["pcpu", "rss"])
def test_the_agent_sees_the_first_ten_rows_of_this_machines_table(by: str) -> None:
    """ps on this machine, sorted by the key: every row is judged, the first ten are shown."""
    argv = ["env", "LC_ALL=C", "ps", "-e", f"--sort=-{by}", "-o", "pid=,state=,pcpu=,rss=,comm="]
    stdout = subprocess.run(argv, capture_output=True, check=True).stdout
    assert len(stdout.splitlines()) > 10
    _, sealed = judged(family("processes"), TOP, stdout, {"by": by})
    rows = sealed["data"]["rows"]
    assert len(rows) == 10
    assert [row["pid"] for row in rows] == [
        int(line.split()[0]) for line in stdout.splitlines()[:10]
    ]


def test_the_published_schema_promises_at_most_ten_rows() -> None:
    """`[agent] rows = 10` is what the envelope schema says, not the schema file's 100,000."""
    assert _max_items(family("processes").operations[TOP].envelope_schema) == 10


def _max_items(schema: object) -> int | None:
    """The maxItems of the first `rows` property found in a published schema."""
    if isinstance(schema, dict):
        rows = schema.get("properties", {}).get("rows")
        if isinstance(rows, dict) and "maxItems" in rows:
            return int(rows["maxItems"])
        for value in schema.values():
            if (found := _max_items(value)) is not None:
                return found
    if isinstance(schema, list):
        for value in schema:
            if (found := _max_items(value)) is not None:
                return found
    return None


def test_a_bad_row_past_the_tenth_still_refuses_the_whole_table() -> None:
    """The rows not shown are still judged: a command line in the 11th row refuses the output."""
    good = b"".join(b"%5d S  0.0  1000 worker%d\n" % (i, i) for i in range(1, 11))
    for eleventh, refusal in (
        (b"   11 S  0.0  1000 \x1b[2Jrm -rf /\n", ("extract", "control_character")),
        (b"   11 Q  0.0  1000 worker11\n", ("schema", "schema_mismatch")),
    ):
        verdict, _ = judged(family("processes"), TOP, good + eleventh, {"by": "pcpu"})
        assert (verdict.stage, verdict.reason) == refusal
