"""Shared test setup: the helpers of tests/support/ (sshd.py, daemon_harness.py, ...) and the
test files of each part are importable by their basename, and fixtures more than one test file
uses.

The tests mirror the package: tests/<part>/ holds the tests of sshadapter/<part>/, tests/ itself
those of the root modules and of the repository as a whole. Test files have no __init__.py
(pytest's default import mode), so every basename is unique across the directories."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# The helpers, then each part: a few test files import what another part's test file defines.
sys.path[:0] = [
    str(TESTS / "support"),
    *sorted(str(p) for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))),
]

from daemon_harness import approver_reachable_dir  # noqa: E402 (after the paths above)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A directory another uid (an approver) can reach: pytest's tmp_path is root's alone."""
    with approver_reachable_dir() as path:
        yield path
