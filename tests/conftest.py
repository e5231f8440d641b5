"""Shared test setup: the tests directory is importable (tests/sshd.py, tests/daemon_harness.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
