"""Shared test setup: the tests directory is importable (tests/sshd.py, tests/daemon_harness.py),
and fixtures more than one test file uses."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_harness import approver_reachable_dir


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A directory another uid (an approver) can reach: pytest's tmp_path is root's alone."""
    with approver_reachable_dir() as path:
        yield path
