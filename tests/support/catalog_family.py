"""Judging one catalog family's outputs, and its ../shared/catalog corpus files, for its tests
(loading a family and reading `check` are catalog_corpus.py's).

The corpus holds other projects' data: it is read from ../shared (tests/support/shared_data.py),
never copied here; without it a test skips, or fails when $CI says it must be there.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from catalog_corpus import CORPUS
from shared_data import require_shared

from sshadapter.contract.evaluate import Verdict, evaluate, seal
from sshadapter.contract.registry import Registry
from sshadapter.runners.interface import RunResult

NOW: Final = datetime(2026, 12, 5, 3, 0, tzinfo=UTC)


def corpus_files(key: str) -> list[Path]:
    """Every corpus file of one key (``proc_sys_fs_file_nr``), in name order."""
    if CORPUS is None or not (CORPUS / key).is_dir():
        return []
    return sorted((CORPUS / key).glob("*.txt"))


def require_corpus(key: str) -> None:
    """Skip (fail under $CI) when the corpus is not there (it comes whole, with sources.json)."""
    require_shared(CORPUS, "sources.json")


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
