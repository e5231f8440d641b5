"""Catalog operations judged on ../shared/catalog: other projects' real kernel files, read there.

``../shared/catalog/corpus/<key>/<id>.txt`` holds real /proc, /sys and os-release files
from other projects' test data and device dumps; ``corpus/sources.json`` names the
repository, commit, licence and system of each. They are other projects' data under their
own terms, so they are read from there and never copied here (found like
tests/check/test_realworld.py's folder: SSHADAPTER_SHARED, else shared/ beside the
repository). Missing, the tests skip, and fail when $CI says it must be there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Final

from shared_data import find_shared, require_shared

from sshadapter.check.nearmiss import derive
from sshadapter.check.report import check_registry
from sshadapter.contract.evaluate import Verdict, evaluate, seal
from sshadapter.contract.registry import Operation, Registry, load_registry
from sshadapter.runners.interface import RunResult

CATALOG: Final = Path(__file__).resolve().parents[2] / "sshadapter" / "catalog"
CORPUS = find_shared(Path("catalog") / "corpus")
NOW: Final = datetime(2026, 12, 5, 1, 41, tzinfo=UTC)
REQUEST_ID: Final = "req.catalog0"


@dataclass(frozen=True)
class CorpusFile:
    """One real file of the corpus and where it came from."""

    key: str
    """The corpus key (``proc_stat``): the file it is a copy of."""
    id: str
    """Its id in sources.json (``gosysinfo_fedora30``)."""
    data: bytes
    """The exact bytes."""
    notes: str
    """sources.json's description of the system."""


def require_corpus() -> Path:
    """The corpus folder, or a skip (a fail when $CI says it must be there)."""
    return require_shared(CORPUS, "sources.json")


def corpus_ids(key: str) -> list[str]:
    """The ids of the corpus files of ``key`` (empty when the corpus is missing: one
    parameter then stands for it and skips or fails in require_corpus)."""
    if CORPUS is None or not (CORPUS / key).is_dir():
        return ["corpus-missing"]
    return sorted(path.stem for path in (CORPUS / key).glob("*.txt"))


def corpus_file(key: str, file_id: str) -> CorpusFile:
    """The file ``key/file_id`` with its provenance notes."""
    folder = require_corpus()
    sources = json.loads((folder / "sources.json").read_bytes())["outputs"]
    entry = next(s for s in sources if s["key"] == key and s["id"] == file_id)
    return CorpusFile(key, file_id, (folder / key / f"{file_id}.txt").read_bytes(), entry["notes"])


@cache
def family(name: str) -> Registry:
    """The family's operations as the daemon loads them, with the shared schemas (once)."""
    return load_registry(CATALOG / name, CATALOG / "schemas", hosts=None)


def misses(registry: Registry) -> list[str]:
    """What `sshadapter check` reports as missed: fixtures and near-misses, with why."""
    return [
        f"{row.tool}/{row.case}/{row.kind}: {row.why}"
        for row in check_registry(registry)
        if not row.ok
    ]


def judged(
    op: Operation, stdout: bytes, args: dict[str, Any] | None = None
) -> tuple[Verdict, dict[str, Any]]:
    """Stages 6-10 on ``stdout`` (exit 0, no stderr) and the envelope, which must fit the
    tool's published schema."""
    verdict = evaluate(op, args or {}, RunResult(stdout, b"", 0), NOW)
    sealed = seal(op, REQUEST_ID, verdict)
    assert op.host_validator.is_valid(sealed)
    return verdict, sealed


def accepted(op: Operation, stdout: bytes, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """The data the agent gets for ``stdout``; fails the test, saying why, if it is refused."""
    verdict, sealed = judged(op, stdout, args)
    assert sealed["outcome"] == "success", verdict.failure
    data: dict[str, Any] = sealed["data"]
    return data


def near_misses_refused(op: Operation, stdout: bytes, args: dict[str, Any] | None = None) -> None:
    """Every near-miss `sshadapter check` derives from an accepted output is refused."""
    for kind, miss in derive(op, stdout):
        assert judged(op, miss, args)[0].code == "INVALID_RESPONSE", kind


def lines_starting(data: bytes, prefix: bytes) -> bytes:
    """What `grep '^PREFIX' FILE` prints for a file: its lines that start with ``prefix``."""
    return b"".join(line for line in data.splitlines(keepends=True) if line.startswith(prefix))


def provenance_gaps(name: str) -> list[str]:
    """Fixture directories of the family whose PROVENANCE.md is missing, misshapen, or silent
    about one of its cases."""
    gaps = []
    for fixtures in sorted((CATALOG / name).glob("*.fixtures")):
        tool = fixtures.name.removesuffix(".fixtures")
        path = fixtures / "PROVENANCE.md"
        lines = [line for line in path.read_text().splitlines() if line] if path.exists() else []
        if lines[:1] != [f"# Provenance: {tool}"] or not lines[1].startswith("Proven on: "):
            gaps.append(f"{tool}: PROVENANCE.md missing or not in the catalog's format")
            continue
        text = "\n".join(lines)
        for case in sorted(fixtures.glob("*.case.json")):
            name = case.name.removesuffix(".case.json")
            if f"`{name}`" not in text:
                gaps.append(f"{tool}: case {name} has no line in PROVENANCE.md")
    return gaps
