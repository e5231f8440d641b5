"""How fast fan-out hosts and SSH handshakes start: a rate the event loop's lag steers.

A count in flight is the wrong bound in a real network: a host's work is a few round trips
of waiting and ~0.4 ms (warm) to ~2.4 ms (cold) of the daemon's CPU, so a count fit for
loopback (16 hosts) leaves a 100 ms fleet 3.5x slower than need be, and a count fit for
100 ms (512) saturates the loop on loopback, where a single call beside a fan-out then
waits 43x its idle time. A rate bounds the CPU whatever the round trip: hosts in flight
grow with the round trip by themselves (rate x time per host). The counts stay, as
ceilings (``[server] max_fanout_hosts_in_flight``, ``[pool] connect_concurrency``).

The rate adapts, so no operator tunes it for their network: starts wait in line (FIFO) for
a timer that lets go every start whose slot has come, and how late that timer fires is the
loop's lag at that moment (one start per loop turn would cap a busy loop at ~200/s).
Over each ``ADJUST_INTERVAL_SECONDS``, the worst lag seen above ``LAG_TARGET_SECONDS``
divides the rate by ``DECREASE``; a window under it adds the pacer's step (AIMD, as TCP
does with its window): a loop busy with fan-out work starts fewer hosts, so a single call
(which never waits here) finds the loop free within about the target.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

# The loop's lag the pacers keep under: a single call takes ~5 loop wake-ups (request,
# channel, exec, output, answer). At 5 ms a call beside back-to-back 512-host fan-outs at
# 20 ms RTT was 2.2-3.2x its idle p50 (1.6x a raw exec's ratio); at 2 ms, 1.84x (1.48x),
# with the fan-outs still 1.00-1.19x raw at 0, 20 and 100 ms (tests/bench/README.md).
LAG_TARGET_SECONDS: Final = 0.002
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


# Fan-out hosts: 1,000/s is ~0.4-0.8 s of CPU a second at 0.4-0.8 ms per warm host. The
# floor is about what two cores sustain with the hosts' own sshd (~2.6 ms a warm host, so
# ~600 hosts/s): below it the pacer, not the machine, made a 512-host fan-out at 20 ms RTT
# 2.1x raw asyncssh (floor 200); at 400 it was 1.05-1.28x at 0, 20 and 100 ms. The ceiling
# is what the loop alone has sustained (~2,500 warm hosts/s of daemon CPU) (rows:
# tests/bench/README.md "Issue 28").
HOST_STARTS: Final = Rates(initial=1000.0, floor=400.0, ceiling=2500.0, step=50.0)
# SSH handshakes: 250/s is ~0.6 s of CPU a second at 2.4 ms per connect (key exchange and
# the host's certificate check); the floor is above what this machine's sshd completes
# (~70 cold hosts/s through raw asyncssh), so the pacer never makes a cold fan-out wait
# longer than the hosts do; the ceiling in the hosts' proportion.
HANDSHAKE_STARTS: Final = Rates(initial=250.0, floor=100.0, ceiling=625.0, step=12.5)

Clock = Callable[[], float]


class Pacer:
    """Starts at most ``rate`` a second, in order; the rate follows the loop's lag."""

    def __init__(self, rates: Rates, *, clock: Clock = time.monotonic) -> None:
        self.rates = rates
        self.rate = rates.initial
        """Starts per second now."""
        self._clock = clock  # the loop's clock in production (both are time.monotonic)
        self._next = 0.0  # when the next start may go (clock seconds)
        self._window_start = clock()
        self._window_lag = 0.0  # the worst lag seen in the current window
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the armed timer should fire

    def take(self, now: float, wanted: int) -> int:
        """How many of ``wanted`` waiting starts may go at ``now``: each takes the next slot,
        1/rate after the one before, so a timer that fired late lets every start whose slot
        has passed go at once (the rate holds on average through the loop's lag)."""
        taken = 0
        while taken < wanted and self._next <= now:
            taken += 1
            self._next += 1 / self.rate
        return taken

    def go_now(self, now: float) -> bool:
        """A start with nobody waiting: it goes if its slot has come. No credit builds up
        while idle: the schedule restarts at ``now``, so after a pause one start goes at
        once and the next 1/rate later."""
        self._next = max(self._next, now)
        return self.take(now, 1) == 1

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
        """Go now if nobody waits and the slot has come; else wait in line for a slot. The
        timer that lets waiters go measures the loop's lag by how late it fires."""
        if not self._waiting and self.go_now(self._clock()):
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if self._timer is None:
            self._arm()
        await waiter

    def _arm(self) -> None:
        self._due = self._next
        delay = max(0.0, self._due - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._release)

    def _release(self) -> None:
        self._timer = None
        now = self._clock()
        self.observe(now - self._due)
        allowed = self.take(now, len(self._waiting))
        while allowed and self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():  # a cancelled waiter gives its slot to the next
                waiter.set_result(None)
                allowed -= 1
        if self._waiting:
            self._arm()
