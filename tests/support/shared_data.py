"""Where the shared test data lives: other projects' corpora, used from there, never copied here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def find_shared(subdir: Path) -> Path | None:
    """SSHADAPTER_SHARED/subdir if set, else shared/subdir beside the repository (resolved or as
    seen), or None when no candidate is a directory."""
    if env := os.environ.get("SSHADAPTER_SHARED"):
        return Path(env) / subdir
    candidates = [
        Path(__file__).resolve().parents[3] / "shared",
        Path(__file__).absolute().parents[2] / ".." / "shared",
        Path.cwd() / ".." / "shared",
    ]
    return next((c / subdir for c in candidates if (c / subdir).is_dir()), None)


def require_shared(found: Path | None, marker: str) -> Path:
    """``found`` when it holds the file ``marker``; else a skip, or a fail when $CI says the
    shared folder must be there."""
    if found is not None and (found / marker).is_file():
        return found
    message = f"shared data not found: {marker} (set SSHADAPTER_SHARED to the shared folder)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
