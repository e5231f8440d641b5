"""Admission (docs/protocol.md "Stages"): how many calls run at once, how many wait.

A call takes a ticket before its first exec: one of ``max_concurrent_calls`` slots, or
a place among ``max_queue`` waiting for one; past both it is OVERLOADED at once, so a
burst is refused quickly instead of piling up behind the calls running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from sshadapter.errors import OverloadedError


class Admission:
    """At most ``slots`` calls run; at most ``queue`` wait; the rest are OVERLOADED at once."""

    def __init__(self, slots: int, queue: int) -> None:
        self._slots = asyncio.Semaphore(slots)
        self._limit = slots + queue
        self.admitted = 0
        """Calls running or waiting for a slot."""

    @contextmanager
    def ticket(self) -> Iterator[asyncio.Semaphore]:
        if self.admitted >= self._limit:
            raise OverloadedError
        self.admitted += 1
        try:
            yield self._slots
        finally:
            self.admitted -= 1
