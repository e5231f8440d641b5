"""Loading one catalog family, its fixtures and the ../shared/catalog corpus for its tests.

The corpus holds other projects' data: it is read from ../shared (tests/support/shared_data.py),
never copied here; without it a test skips, or fails when $CI says it must be there.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest
from shared_data import find_shared

from sshadapter.check.report import check_registry
from sshadapter.contract.evaluate import Verdict, evaluate, seal
from sshadapter.contract.registry import Registry, load_registry
from sshadapter.runners.interface import RunResult

CATALOG: Final = Path(__file__).resolve().parents[2] / "sshadapter" / "catalog"
CORPUS = find_shared(Path("catalog") / "corpus")
NOW: Final = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)


@cache
def family(name: str) -> Registry:
    """The operations of one catalog family, with the catalog's shared schemas (loaded once)."""
    return load_registry(CATALOG / name, CATALOG / "schemas", hosts=None)


def misses(registry: Registry) -> list[str]:
    """What `sshadapter check` reports as missed for the family: fixtures and near-misses."""
    return [
        f"{row.tool}/{row.case}/{row.kind}: {row.why}"
        for row in check_registry(registry)
        if not row.ok
    ]


def corpus_files(key: str) -> list[Path]:
    """Every corpus file of one key (``proc_sys_fs_file_nr``), in name order."""
    if CORPUS is None or not (CORPUS / key).is_dir():
        return []
    return sorted((CORPUS / key).glob("*.txt"))


def require_corpus(key: str) -> None:
    """Skip (fail under $CI) when the corpus of ``key`` is not there."""
    if corpus_files(key):
        return
    message = f"../shared/catalog/corpus/{key} not found (set SSHADAPTER_SHARED)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def judged(
    registry: Registry, tool: str, stdout: bytes, args: dict[str, Any] | None = None
) -> tuple[Verdict, dict[str, Any]]:
    """Stages 6-10 for one output (exit 0, no stderr) and its envelope, checked against
    the tool's published schema."""
    op = registry.operations[tool]
    verdict = evaluate(op, args or {}, RunResult(stdout, b"", 0), NOW)
    sealed = seal(op, "req.catalog0000", verdict)
    assert op.envelope_validator.is_valid(sealed) or op.host_validator.is_valid(sealed)
    return verdict, sealed
