"""How fast fan-out hosts and SSH handshakes start: a rate the event loop's lag steers.

A count in flight is the wrong bound in a real network: a host's work is a few round trips
of waiting and ~0.4 ms (warm) to ~2.4 ms (cold) of the daemon's CPU, so a count fit for
loopback (16 hosts) leaves a 100 ms fleet 3.5x slower than need be, and a count fit for
100 ms (512) saturates the loop on loopback, where a single call beside a fan-out then
waits 43x its idle time. A rate bounds the CPU whatever the round trip: hosts in flight
grow with the round trip by themselves (rate x time per host). The counts stay, as
ceilings (``[server] max_fanout_hosts_in_flight``, ``[pool] connect_concurrency``).

The rate adapts, so no operator tunes it for their network: every start waits its turn
(one at a time, FIFO), and how late its wake-up comes is the loop's lag at that moment.
Over each ``ADJUST_INTERVAL_SECONDS``, the worst lag seen above ``LAG_TARGET_SECONDS``
divides the rate by ``DECREASE``; a window under it adds the pacer's step (AIMD, as TCP
does with its window): a loop busy with fan-out work starts fewer hosts, so a single call
(which never waits here) finds the loop free within about the target.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

# The loop's lag the pacers keep under: a single call takes ~5 loop wake-ups (request,
# channel, exec, output, answer), so 5 ms each keeps it within ~2x of a 26 ms idle call.
LAG_TARGET_SECONDS: Final = 0.005
# How often the rate moves: about one loop turn under a fan-out, so a burst of lag is
# answered within it, and the many starts that wake in one turn count once.
ADJUST_INTERVAL_SECONDS: Final = 0.010
DECREASE: Final = 2.0  # the rate is halved per lagging window (multiplicative decrease)


@dataclass(frozen=True)
class Rates:
    """A pacer's starts per second: where it begins, its floor, ceiling and additive step."""

    initial: float
    floor: float
    ceiling: float
    step: float  # added per window under the lag target


# Fan-out hosts: 1,000/s is ~0.4 s of CPU a second at 0.4 ms per warm host, and matched raw
# asyncssh at every RTT measured (tests/bench/README.md "bench_fleet.py"); the floor keeps
# a fan-out going on a loop busy with other work (200 hosts/s: 512 hosts in 2.6 s); the
# ceiling is what the loop has ever sustained (~2,500 warm hosts/s of daemon CPU alone).
HOST_STARTS: Final = Rates(initial=1000.0, floor=200.0, ceiling=2500.0, step=50.0)
# SSH handshakes: 250/s is ~0.6 s of CPU a second at 2.4 ms per connect (key exchange and
# the host's certificate check); floor and ceiling in the same proportion as the hosts'.
HANDSHAKE_STARTS: Final = Rates(initial=250.0, floor=50.0, ceiling=625.0, step=12.5)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class Pacer:
    """Starts at most ``rate`` a second, one at a time; the rate follows the loop's lag."""

    def __init__(
        self, rates: Rates, *, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep
    ) -> None:
        self.rates = rates
        self.rate = rates.initial
        """Starts per second now."""
        self._clock = clock
        self._sleep = sleep
        self._next = 0.0  # the earliest the next start may go (clock seconds)
        self._window_start = clock()
        self._window_lag = 0.0  # the worst lag seen in the current window
        self._turn = asyncio.Lock()  # FIFO: each start takes its slot at the head

    def reserve(self) -> float:
        """Take the next start's slot: how long to wait for it (0: now). No credit builds
        up while idle: a start after a pause goes now, the one after it 1/rate later."""
        now = self._clock()
        slot = max(now, self._next)
        self._next = slot + 1 / self.rate
        return slot - now

    def observe(self, lag: float) -> None:
        """One measure of the loop's lag (seconds late); the rate moves once per window."""
        self._window_lag = max(self._window_lag, lag)
        now = self._clock()
        if now - self._window_start < ADJUST_INTERVAL_SECONDS:
            return
        if self._window_lag > LAG_TARGET_SECONDS:
            self.rate = max(self.rates.floor, self.rate / DECREASE)
        else:
            self.rate = min(self.rates.ceiling, self.rate + self.rates.step)
        self._window_start, self._window_lag = now, 0.0

    async def start(self) -> None:
        """Wait for this start's turn; the wake-up's lateness is a lag measure."""
        async with self._turn:
            delay = self.reserve()
            due = self._clock() + delay
            await self._sleep(delay)  # even 0: one loop turn, and its length is the lag
            self.observe(self._clock() - due)
