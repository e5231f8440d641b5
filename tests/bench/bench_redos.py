"""Issue 9 defect 4: what one pathological output line costs the event loop.

Run: ``python tests/bench/bench_redos.py`` (a few seconds). A benchmark, not a test:
it always exits 0 and prints PASS/FAIL.

The operator's row ``^(?P<x>(\\S+ ?)+)$`` (nested quantifiers) against a line of
``a`` x N and a tab, which almost matches. Timed: the package's ``lines`` extractor
(RE2, sshadapter/contract/linear_regex.py) on the 26-byte line of the issue and on longer
ones, beside Python's ``re`` on short lines (it doubles with each byte, so the
longer lines are left to the extrapolation it prints). The whole call is one
synchronous stretch of the event loop, so its time is the loop time it costs.
"""

from __future__ import annotations

import re
import time
from typing import Final

from sshadapter.contract.extract import LinesFormat
from sshadapter.contract.linear_regex import compile_linear
from sshadapter.errors import EvidenceError

ROW: Final = r"^(?P<x>(\S+ ?)+)$"
TARGET_MS: Final = 10.0  # the issue: under 10 ms of loop time


def line(length: int) -> bytes:
    return b"a" * (length - 1) + b"\t\n"


def time_extractor(length: int, repeat: int = 20) -> float:
    """Best of ``repeat`` runs, in ms, of the lines extractor rejecting one such line."""
    fmt = LinesFormat(1 << 20, (), compile_linear(ROW), "rows", 1000, {})
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            fmt.parse(line(length))
        except EvidenceError as exc:
            assert exc.reason == "unmatched_line"
        best = min(best, time.perf_counter() - started)
    return best * 1000


def time_python_re(length: int) -> float:
    pattern = re.compile(ROW)
    text = line(length).decode()[:-1]
    started = time.perf_counter()
    assert pattern.fullmatch(text) is None
    return (time.perf_counter() - started) * 1000


def main() -> None:
    print(f"row {ROW!r}, a line of 'a' x (N-1) and a tab")
    print(f"  {'N bytes':>8}  {'RE2 extractor ms':>16}  {'Python re ms':>12}")
    python_ms: dict[int, float] = {}
    for length in (16, 18, 20, 22):
        python_ms[length] = time_python_re(length)
    for length in (16, 18, 20, 22, 26, 27, 64, 4096):
        ours = time_extractor(length)
        theirs = f"{python_ms[length]:12.1f}" if length in python_ms else " " * 12
        print(f"  {length:8d}  {ours:16.4f}  {theirs}")
    growth = (python_ms[22] / python_ms[20]) ** 0.5  # per byte
    at26 = python_ms[22] * growth**4 / 1000
    at27 = python_ms[22] * growth**5 / 1000
    print(f"  Python re grows {growth:.2f}x per byte: 26 bytes ~ {at26:.1f} s, 27 ~ {at27:.1f} s")
    measured = time_extractor(26)
    verdict = "PASS" if measured <= TARGET_MS else "FAIL"
    print(
        f"\n  {verdict}  the issue's 26-byte line costs {measured:.4f} ms of loop time "
        f"(target <= {TARGET_MS:g} ms)"
    )


if __name__ == "__main__":
    main()
