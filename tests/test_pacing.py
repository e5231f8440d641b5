"""Start pacing: starts go at the pacer's rate, and the rate follows the loop's lag (AIMD).

The clock and the sleep are injected, so each test is exact: no loop timing is measured.
The pacer as the daemon uses it, over a real fleet, is in tests/runners/test_ssh_fleet.py.
"""

from __future__ import annotations

import asyncio
import time

from sshadapter.pacing import ADJUST_INTERVAL_SECONDS, DECREASE, LAG_TARGET_SECONDS, Pacer, Rates

RATES = Rates(initial=100.0, floor=25.0, ceiling=200.0, step=10.0)
WINDOW = ADJUST_INTERVAL_SECONDS * 1.5  # past one window, whatever the float rounding


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_starts_are_spaced_at_the_rate_with_no_credit_from_idle() -> None:
    """Starts go 1/rate apart, the first at once, and an idle pause earns no burst."""
    clock = Clock()
    pacer = Pacer(RATES, clock=clock)
    assert [pacer.go_now(clock.now) for _ in range(2)] == [True, False]  # next: 10 ms on
    clock.now += 0.015
    assert pacer.take(clock.now, 5) == 1
    clock.now += 5.0  # idle: one now, the next 1/rate later
    assert [pacer.go_now(clock.now) for _ in range(2)] == [True, False]


def test_a_late_timer_lets_every_start_whose_slot_passed_go_at_once() -> None:
    """A release 35 ms late at 100/s lets the 4 starts whose slots passed go together."""
    clock = Clock()
    pacer = Pacer(RATES, clock=clock)
    assert pacer.go_now(clock.now)
    clock.now += 0.045  # the slot at +10 ms, released at +45: +10, +20, +30, +40 have come
    assert pacer.take(clock.now, 10) == 4
    assert pacer.take(clock.now, 10) == 0


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


def test_waiters_go_in_order_and_a_late_release_slows_the_rate() -> None:
    """Waiters go in order, each after its slot; a release past the lag target slows them."""
    order: list[int] = []

    async def starts() -> float:
        pacer = Pacer(Rates(initial=200.0, floor=25.0, ceiling=200.0, step=10.0))

        async def one(i: int) -> None:
            await pacer.start()
            order.append(i)

        tasks = [asyncio.ensure_future(one(i)) for i in range(4)]
        await asyncio.sleep(0)
        time.sleep(ADJUST_INTERVAL_SECONDS + LAG_TARGET_SECONDS * 2)  # the loop lags
        await asyncio.gather(*tasks)
        return pacer.rate

    rate = asyncio.run(starts())
    assert order == [0, 1, 2, 3]
    # Halved by the late release; a window under the target may have added a step since.
    assert 200.0 / DECREASE <= rate < 200.0
