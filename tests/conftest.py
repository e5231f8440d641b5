"""Shared test setup: the tests directory is importable (tests/sshd.py, tests/daemon_harness.py),
and fixtures more than one test file uses."""

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A directory another uid (an approver) can reach: pytest's tmp_path is root's alone."""
    path = Path(tempfile.mkdtemp(prefix="sshadapter-approve-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
