"""A fan-out's answer, built as its hosts finish: every host counted, few entries kept.

The answer (docs/protocol.md "The fan-out envelope") counts every host but shows at
most ``[fanout] max_results`` entries: failures first (by code, then alias), then
successes (by alias). That order is known the moment a host is sealed, so each
host's envelope line is kept only while it is among the first ``max_results`` so far
and dropped as soon as one before it pushes it out: what a fan-out holds is the
counts and at most ``max_results`` lines, however many hosts it has and however
much each one printed. Only the entries shown are parsed, once, at the end.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any

import orjson

from sshadapter.contract import envelope
from sshadapter.contract.evaluate import Sealed

_Key = tuple[int, str, str]
"""A host's place in the answer: (0, code, alias) for a failure, (1, "", alias) after."""


class FanoutAnswer:
    """The counts of every host of one fan-out, and the envelope lines of those shown."""

    def __init__(self, max_results: int) -> None:
        self.max_results = max_results
        self.kinds: collections.Counter[tuple[str, str]] = collections.Counter()
        """Hosts by (outcome, code), the code empty on success: the answer's counts and
        the metrics' series."""
        self._shown: list[tuple[_Key, bytes]] = []
        """The hosts shown so far, in the answer's order, each with its envelope line."""

    def add(self, host: str, sealed: Sealed) -> None:
        """Count ``host``; keep its line only while it is among the first ``max_results``."""
        self.kinds[sealed.outcome, sealed.code or ""] += 1
        key = (1, "", host) if sealed.code is None else (0, sealed.code, host)
        place = bisect.bisect(self._shown, key, key=lambda kept: kept[0])
        if place >= self.max_results:
            return  # after every entry shown so far: never shown
        # An exact-size copy: orjson's buffer behind a line can be twice its length.
        self._shown.insert(place, (key, memoryview(sealed.line).tobytes()))
        if len(self._shown) > self.max_results:
            self._shown.pop()  # the last in the answer's order: never shown now

    def failures_by_code(self) -> dict[str, int]:
        """Hosts failed, by code, in the codes' order (the answer's and the log line's)."""
        return dict(
            sorted((code, n) for (outcome, code), n in self.kinds.items() if outcome == "failure")
        )

    def data(self, target: str) -> dict[str, Any]:
        """The answer's `data`: the counts and the entries shown, each parsed from its line."""
        by_code = self.failures_by_code()
        hosts = sum(self.kinds.values())
        failed = sum(by_code.values())
        return {
            "target": target,
            "hosts": hosts,
            "succeeded": hosts - failed,
            "failed": failed,
            "omitted": hosts - len(self._shown),
            "failures_by_code": by_code,
            "results": [
                envelope.host_entry(host, orjson.loads(line)) for (_, _, host), line in self._shown
            ],
        }
