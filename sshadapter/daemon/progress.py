"""Progress lines: what a call that asked for them says before its answer (docs/protocol.md
"Progress").

A `call` request with ``"progress": 1`` (client.PROGRESS_VERSION) gets zero or more progress
lines on its connection before its one answer line. A progress line holds counts and
fixed words only, never a byte from a host, an argument or the caller: ``{"progress":
{"done": <hosts answered>, "total": <hosts>}}`` as a fan-out's hosts answer, and
``{"progress": {"waiting": "approval"}}`` once the call waits for a person. A call that
did not ask gets its one answer line, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import orjson

PROGRESS_INTERVAL_SECONDS: Final = 0.5
"""At most one host count per call this often (plus the last, all hosts done): a
1,000-host fan-out says where it is twice a second, not a thousand times."""
WAITING_FOR_APPROVAL: Final = orjson.dumps(
    {"progress": {"waiting": "approval"}}, option=orjson.OPT_APPEND_NEWLINE
)

Report = Callable[[bytes], None]
"""Writes one progress line to the caller's connection, or drops it (a slow reader)."""


class Progress:
    """One call's progress lines, rate-limited; the silent one is NO_PROGRESS."""

    def __init__(self, report: Report | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._report = report
        self._clock = clock
        self._done = 0
        self._last = -PROGRESS_INTERVAL_SECONDS

    def waiting_for_approval(self) -> None:
        """The call waits for a person (said once: the wait has one beginning)."""
        if self._report is not None:
            self._report(WAITING_FOR_APPROVAL)

    def host_done(self, total: int) -> None:
        """One more host of ``total`` has its answer: said if the interval allows, or if
        it was the last."""
        if self._report is None:
            return
        self._done += 1
        now = self._clock()
        if self._done < total and now - self._last < PROGRESS_INTERVAL_SECONDS:
            return
        self._last = now
        line = {"progress": {"done": self._done, "total": total}}
        self._report(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))


NO_PROGRESS: Final = Progress(None)
"""A call that asked for no progress lines: shared by all of them, it counts nothing."""
