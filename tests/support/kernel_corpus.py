"""The catalog operations against ../shared/catalog: real kernel files of other systems.

``../shared/catalog/corpus/<key>/<id>.txt`` holds /proc and /sys files from other
projects' test data and device dumps (2.6 to 6.x kernels, x86, ARM, MIPS, gVisor), and
``sources.json`` names each file's system, repository, commit and licence. They are
other projects' data, so they are read from there and never copied here; found like
``../shared/realworld/`` (tests/support/shared_data.py), skipped when missing, a failure when
$CI says it must be there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from catalog_corpus import CORPUS
from shared_data import find_shared, require_shared

from sshadapter.contract.evaluate import evaluate, seal
from sshadapter.contract.registry import Operation, Registry
from sshadapter.runners.interface import RunResult

MISSING: Final = "corpus-missing"
NOW: Final = datetime(2026, 11, 30, 4, 12, tzinfo=UTC)
Reader = Callable[[str], Any]
"""A plain reading of a kernel file, written apart from the operation's patterns."""


def _sources() -> dict[str, dict[str, Any]]:
    if CORPUS is None or not (CORPUS / "sources.json").is_file():
        return {}
    outputs: list[dict[str, Any]] = json.loads((CORPUS / "sources.json").read_bytes())["outputs"]
    return {f"{o['key']}/{o['id']}": o for o in outputs}


SOURCES: Final = _sources()


def ids(key: str) -> list[str]:
    """The corpus files of ``key`` (as parametrize ids), or one id that fails when needed."""
    return sorted(name.split("/", 1)[1] for name in SOURCES if name.startswith(f"{key}/")) or [
        MISSING
    ]


def corpus_bytes(key: str, id_: str) -> bytes:
    """One corpus file's bytes; a skip (a failure under $CI) when the corpus is missing."""
    return (require_shared(CORPUS, "sources.json") / key / f"{id_}.txt").read_bytes()


def shared_bytes(path: Path) -> bytes:
    """Another file of ../shared (``realworld/outputs/...``); a skip or a failure as above."""
    return (require_shared(find_shared(path.parent), path.name) / path.name).read_bytes()


def cases(readers: dict[str, tuple[str, Reader]]) -> list[tuple[str, str]]:
    """(tool, corpus file id) for every file of each tool's key, as parametrize cases."""
    return [(tool, id_) for tool, (key, _) in readers.items() for id_ in ids(key)]


def corpus_data(
    registry: Registry, readers: dict[str, tuple[str, Reader]], tool: str, id_: str
) -> tuple[Any, Any]:
    """What the operation gives the agent for one corpus file, and what a person reads in it."""
    key, read = readers[tool]
    stdout = corpus_bytes(key, id_)
    sealed = judged(registry.operations[tool], stdout)
    return sealed.get("data", sealed), read(stdout.decode())


def judged(op: Operation, stdout: bytes) -> dict[str, Any]:
    """The envelope of ``stdout`` (exit 0, no stderr), valid against the tool's published schema."""
    verdict = evaluate(op, {}, RunResult(stdout, b"", 0), NOW)
    sealed = seal(op, "req.corpus00", verdict)
    assert op.host_validator.is_valid(sealed)  # the full schema, data values included
    if sealed["outcome"] == "failure":
        failure = verdict.failure
        assert failure is not None
        sealed["why"] = f"{failure.stage}/{failure.reason}: {failure.detail}"
    return sealed
