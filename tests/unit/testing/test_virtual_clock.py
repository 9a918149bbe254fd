"""`VirtualClock` (SPEC §7): time jumps only when every task is blocked, and costs no real time."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from polygate_celery.clock import Clock
from polygate_celery.testing import VirtualClock


def test_a_virtual_clock_is_a_clock(clock: VirtualClock) -> None:
    assert isinstance(clock, Clock)
    assert clock.now() == 0.0
    assert VirtualClock(start=1000.0).now() == 1000.0


async def test_a_long_sleep_is_instant_and_exact(clock: VirtualClock) -> None:
    started = time.monotonic()
    await clock.sleep(300)
    assert time.monotonic() - started < 1.0
    assert clock.now() == 300.0
    await clock.sleep(0.25)
    assert clock.now() == 300.25


async def test_sleepers_wake_in_deadline_order_at_their_deadlines(clock: VirtualClock) -> None:
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    await asyncio.gather(sleeper("c", 30), sleeper("a", 10), sleeper("b", 20))
    assert woke == [("a", 10.0), ("b", 20.0), ("c", 30.0)]


async def test_equal_deadlines_wake_in_the_order_they_went_to_sleep(clock: VirtualClock) -> None:
    woke: list[int] = []

    async def sleeper(i: int) -> None:
        await clock.sleep(5)
        woke.append(i)

    order = [3, 0, 4, 1, 2]
    tasks = []
    for i in order:
        tasks.append(asyncio.create_task(sleeper(i)))
        await asyncio.sleep(0)  # let it reach its sleep before the next one starts
    await asyncio.gather(*tasks)
    assert woke == order
    assert clock.now() == 5.0


async def test_a_sleeper_that_sleeps_again_interleaves_by_deadline(clock: VirtualClock) -> None:
    log: list[tuple[str, float]] = []

    async def ticker() -> None:
        for _ in range(3):
            await clock.sleep(2)
            log.append(("tick", clock.now()))

    async def once() -> None:
        await clock.sleep(3)
        log.append(("once", clock.now()))

    await asyncio.gather(ticker(), once())
    assert log == [("tick", 2.0), ("once", 3.0), ("tick", 4.0), ("tick", 6.0)]


async def test_time_does_not_jump_while_another_task_can_run(clock: VirtualClock) -> None:
    seen: list[float] = []

    async def busy() -> None:
        for _ in range(500):
            seen.append(clock.now())
            await asyncio.sleep(0)

    sleeper = asyncio.create_task(clock.sleep(10))
    await asyncio.sleep(0)  # the sleeper is parked on the clock
    await busy()
    assert set(seen) == {0.0}
    assert not sleeper.done()
    await sleeper
    assert clock.now() == 10.0


async def test_time_does_not_jump_while_tasks_hand_work_to_each_other(
    clock: VirtualClock,
) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    seen: list[float] = []

    async def producer() -> None:
        for i in range(50):
            await queue.put(i)
            await asyncio.sleep(0)
        await queue.put(-1)

    async def consumer() -> None:
        while await queue.get() >= 0:
            seen.append(clock.now())

    sleeper = asyncio.create_task(clock.sleep(1))
    await asyncio.gather(producer(), consumer())
    assert seen == [0.0] * 50
    await sleeper
    assert clock.now() == 1.0


async def test_a_cancelled_sleeper_neither_blocks_nor_disturbs_others(
    clock: VirtualClock,
) -> None:
    early = asyncio.create_task(clock.sleep(10))
    late = asyncio.create_task(clock.sleep(20))
    await asyncio.sleep(0)
    early.cancel()
    with pytest.raises(asyncio.CancelledError):
        await early
    assert clock.now() == 0.0
    await late
    assert clock.now() == 20.0  # straight to the live deadline; the cancelled one is skipped


async def test_a_cancelled_sleeper_among_equal_deadlines(clock: VirtualClock) -> None:
    woke: list[str] = []

    async def sleeper(name: str) -> None:
        await clock.sleep(5)
        woke.append(name)

    tasks = {name: asyncio.create_task(sleeper(name)) for name in "abc"}
    await asyncio.sleep(0)
    tasks["b"].cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert woke == ["a", "c"]
    assert tasks["b"].cancelled()
    assert clock.now() == 5.0


async def test_cancellation_propagates_out_of_a_sleep(clock: VirtualClock) -> None:
    cleaned_up: list[float] = []

    async def worker() -> None:
        try:
            await clock.sleep(100)
        finally:
            cleaned_up.append(clock.now())

    task = asyncio.create_task(worker())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert cleaned_up == [0.0]
    await clock.sleep(1)  # the clock still works afterwards
    assert clock.now() == 1.0


async def test_a_sleeper_cancelled_after_time_moved_stays_cancelled(clock: VirtualClock) -> None:
    async def slow() -> None:
        await clock.sleep(100)

    task = asyncio.create_task(slow())
    waiter = asyncio.create_task(clock.sleep(5))
    await waiter
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.now() == 5.0


@pytest.mark.parametrize("seconds", [0, 0.0, -1, -1e9, -math.inf, math.nan])
async def test_zero_and_negative_sleeps_yield_without_moving_time(
    clock: VirtualClock, seconds: float
) -> None:
    ran: list[bool] = []

    async def other() -> None:
        ran.append(True)

    task = asyncio.create_task(other())
    await clock.sleep(seconds)
    assert ran == [True]  # the sleep gave the other task its turn
    assert clock.now() == 0.0
    await task


async def test_advance_moves_time_by_hand(clock: VirtualClock) -> None:
    clock.advance(12.5)
    assert clock.now() == 12.5
    clock.advance(0)
    assert clock.now() == 12.5
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)
    assert clock.now() == 12.5


async def test_advance_brings_a_sleeper_due_and_time_never_goes_back(
    clock: VirtualClock,
) -> None:
    sleeper = asyncio.create_task(clock.sleep(10))
    await asyncio.sleep(0)
    clock.advance(25)  # past the sleeper's deadline
    await sleeper
    assert clock.now() == 25.0


async def test_sleeping_forever_is_refused(clock: VirtualClock) -> None:
    with pytest.raises(ValueError, match="forever"):
        await clock.sleep(math.inf)
    assert clock.now() == 0.0
    await clock.sleep(1)  # nothing was left behind on the timer heap
    assert clock.now() == 1.0
