"""Start pacing: starts go at the pacer's rate, and the rate follows the loop's lag (AIMD).

The clock and the sleep are injected, so each test is exact: no loop timing is measured.
The pacer as the daemon uses it, over a real fleet, is in tests/test_ssh_fleet.py.
"""

from __future__ import annotations

import asyncio

import pytest

from sshadapter.pacing import ADJUST_INTERVAL_SECONDS, DECREASE, LAG_TARGET_SECONDS, Pacer, Rates

RATES = Rates(initial=100.0, floor=25.0, ceiling=200.0, step=10.0)
WINDOW = ADJUST_INTERVAL_SECONDS * 1.5  # past one window, whatever the float rounding


class Clock:
    """A clock that moves only when told (or when the fake sleep sleeps, plus a lag)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.lag = 0.0  # every sleep wakes this late
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds + self.lag


def test_starts_are_spaced_at_the_rate_with_no_credit_from_idle() -> None:
    """Starts go 1/rate apart, the first at once, and an idle pause earns no burst."""
    clock = Clock()
    pacer = Pacer(RATES, clock=clock)
    assert [pacer.reserve() for _ in range(3)] == pytest.approx([0.0, 0.01, 0.02])
    clock.now += 5.0
    assert [pacer.reserve() for _ in range(2)] == pytest.approx([0.0, 0.01])


def test_a_lagging_window_divides_the_rate_down_to_its_floor() -> None:
    """Each window lagging past the target divides the rate by DECREASE, never below the floor."""
    clock = Clock()
    pacer = Pacer(RATES, clock=clock)
    rates = []
    for _ in range(4):
        clock.now += WINDOW
        pacer.observe(LAG_TARGET_SECONDS * 2)
        rates.append(pacer.rate)
    assert rates == [100 / DECREASE, 100 / DECREASE**2, 25.0, 25.0]


def test_a_quiet_window_adds_the_step_up_to_the_ceiling() -> None:
    """Each window under the lag target adds the step, never past the ceiling."""
    clock = Clock()
    pacer = Pacer(RATES, clock=clock)
    for _ in range(15):
        clock.now += WINDOW
        pacer.observe(LAG_TARGET_SECONDS / 2)
    assert pacer.rate == 200.0


def test_many_lags_in_one_window_move_the_rate_once_by_the_worst() -> None:
    """Many lags in one window move the rate once, by the worst of them, when it ends."""
    clock = Clock()
    pacer = Pacer(RATES, clock=clock)
    for lag in (LAG_TARGET_SECONDS * 3, 0.0, 0.0):  # inside the window: no move yet
        pacer.observe(lag)
    assert pacer.rate == 100.0
    clock.now += WINDOW
    pacer.observe(0.0)
    assert pacer.rate == 100 / DECREASE


def test_start_waits_its_slot_and_its_late_wake_up_slows_the_rate() -> None:
    """start() sleeps until its slot (even 0: one loop turn), and a late wake-up slows the rate."""
    clock = Clock()
    pacer = Pacer(RATES, clock=clock, sleep=clock.sleep)
    clock.lag = WINDOW  # each wake-up lags past the target and ends a window

    async def starts() -> None:
        for _ in range(3):
            await pacer.start()

    asyncio.run(starts())
    assert clock.slept[0] == 0.0  # the first goes at once, then each window halves the rate
    assert pacer.rate == RATES.floor  # 100, 50, 25: halved per window to the floor
    clock.now += 1.0  # idle: the next start goes now, the one after at the new spacing
    assert [pacer.reserve() for _ in range(2)] == pytest.approx([0.0, 1 / pacer.rate])
