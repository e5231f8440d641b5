"""One row of a benchmark's target table: what was measured, against which target, PASS/FAIL."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Row:
    label: str
    measured: float
    sense: Literal["<=", ">="]
    target: float
    unit: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        if math.isnan(self.measured):
            return False
        return self.measured <= self.target if self.sense == "<=" else self.measured >= self.target

    def format(self, width: int) -> str:
        unit = f" {self.unit}" if self.unit else ""
        places = 3 if self.unit == "x" else 2  # a ratio near its target needs the third digit
        measured = f"{self.measured:.{places}f}{unit}"
        target = f"{self.sense} {self.target:g}{unit}"
        verdict = "PASS" if self.ok else "FAIL"
        detail = f"  {self.detail}" if self.detail else ""
        return f"  {verdict}  {self.label:<{width}} {measured:>11} {target:>11}{detail}"


def print_rows(title: str, rows: Iterable[Row]) -> None:
    rows = list(rows)
    width = max((len(r.label) for r in rows), default=10)
    print(f"\n{title}")
    print(f"  {'':4}  {'figure':<{width}} {'measured':>11} {'target':>11}")
    for row in rows:
        print(row.format(width))
    passed = sum(r.ok for r in rows)
    print(f"  {passed} of {len(rows)} targets met", flush=True)
