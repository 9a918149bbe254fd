"""The per-call stall clock and the stall verdict (SPEC §3 rules 1, 2 and 8)."""

from __future__ import annotations

import asyncio
import math

import pytest

from polygate_celery.core.stall import StallClock, is_stalled


class FakeNow:
    """A plain mutable clock: call it for the time, `advance` it by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = [start]

    def __call__(self) -> float:
        return self.t[0]

    def advance(self, seconds: float) -> None:
        self.t[0] += seconds


def attempt_that_raises(
    clock: StallClock, now: FakeNow, seconds: float, error: BaseException, refund: bool = False
) -> None:
    with clock.attempting() as attempt:
        now.advance(seconds)
        if refund:
            attempt.refund()
        raise error


@pytest.fixture
def now() -> FakeNow:
    return FakeNow()


def test_a_new_clock_has_no_stall_time(now: FakeNow) -> None:
    clock = StallClock(now)
    assert clock.entered_at == 1000.0
    assert clock.stalled_s() == 0.0
    assert clock.productive_s == 0.0


def test_waiting_outside_an_attempt_is_stall_time(now: FakeNow) -> None:
    clock = StallClock(now)
    now.advance(12.5)
    assert clock.elapsed_s() == 12.5
    assert clock.stalled_s() == 12.5


def test_time_inside_an_attempt_is_productive_not_stall(now: FakeNow) -> None:
    clock = StallClock(now)
    now.advance(3.0)  # permit queueing
    with clock.attempting():
        now.advance(300.0)  # a full timeout_s: burns the retry budget
    now.advance(1.0)  # backoff sleep
    assert clock.productive_s == 300.0
    assert clock.elapsed_s() == 304.0
    assert clock.stalled_s() == 4.0


def test_stall_time_is_measured_live_during_an_attempt(now: FakeNow) -> None:
    clock = StallClock(now)
    now.advance(2.0)
    with clock.attempting():
        now.advance(50.0)
        # Productive time is booked at the end of the attempt.
        assert clock.productive_s == 0.0
    assert clock.stalled_s() == 2.0


def test_refund_returns_the_attempt_time_to_the_stall_budget(now: FakeNow) -> None:
    clock = StallClock(now)
    with clock.attempting() as attempt:
        now.advance(300.0)  # an exempt 429 after the whole timeout
        attempt.refund()
    assert attempt.refunded
    assert clock.productive_s == 0.0
    assert clock.stalled_s() == 300.0


def test_refund_affects_only_its_own_attempt(now: FakeNow) -> None:
    clock = StallClock(now)
    with clock.attempting() as first:
        now.advance(10.0)
        first.refund()
    with clock.attempting():
        now.advance(20.0)
    assert clock.productive_s == 20.0
    assert clock.stalled_s() == 10.0


def test_seed_queueing_gateway_example_in_clock_terms(now: FakeNow) -> None:
    # Exempt 429 at timeout_s = 300, backoff 1 s: 301 s of stall time after one attempt.
    clock = StallClock(now)
    with clock.attempting() as attempt:
        now.advance(300.0)
        attempt.refund()
    now.advance(1.0)
    assert is_stalled(clock.stalled_s(), math.inf, stall_window_s=300.0)


def test_a_single_timeout_never_stalls_whatever_the_window(now: FakeNow) -> None:
    clock = StallClock(now)
    with clock.attempting():
        now.advance(10_000.0)
    assert not is_stalled(clock.stalled_s(), math.inf, stall_window_s=1.0)


@pytest.mark.parametrize("error", [RuntimeError("boom"), asyncio.CancelledError()])
def test_an_exception_propagates_and_the_attempt_is_still_booked(
    now: FakeNow, error: BaseException
) -> None:
    clock = StallClock(now)
    with pytest.raises(type(error)):
        attempt_that_raises(clock, now, 7.0, error)
    assert clock.productive_s == 7.0
    assert clock.stalled_s() == 0.0


def test_a_refunded_attempt_that_raises_is_still_refunded(now: FakeNow) -> None:
    clock = StallClock(now)
    with pytest.raises(asyncio.CancelledError):
        attempt_that_raises(clock, now, 7.0, asyncio.CancelledError(), refund=True)
    assert clock.productive_s == 0.0
    assert clock.stalled_s() == 7.0


def test_clocks_of_concurrent_calls_are_independent(now: FakeNow) -> None:
    first = StallClock(now)
    now.advance(5.0)
    second = StallClock(now)
    with first.attempting():
        now.advance(5.0)
    assert first.stalled_s() == 5.0
    assert second.stalled_s() == 5.0
    assert second.productive_s == 0.0


@pytest.mark.parametrize(
    ("stalled_s", "progress_age_s", "expected"),
    [
        (10.0, 10.0, False),  # neither exceeded
        (301.0, 10.0, False),  # this call stuck, scope alive
        (10.0, 301.0, False),  # scope stuck, this call fresh
        (301.0, 301.0, True),  # both exceeded
    ],
)
def test_is_stalled_only_when_both_exceed_the_window(
    stalled_s: float, progress_age_s: float, expected: bool
) -> None:
    assert is_stalled(stalled_s, progress_age_s, stall_window_s=300.0) is expected


def test_infinite_progress_age_counts_as_exceeded() -> None:
    assert is_stalled(301.0, math.inf, 300.0)
    assert not is_stalled(300.0, math.inf, 300.0)


def test_is_stalled_boundary_is_strict() -> None:
    assert not is_stalled(300.0, 301.0, 300.0)
    assert not is_stalled(301.0, 300.0, 300.0)
    assert not is_stalled(300.0, 300.0, 300.0)
    assert is_stalled(math.nextafter(300.0, math.inf), math.nextafter(300.0, math.inf), 300.0)


async def test_cancelling_a_task_inside_an_attempt_propagates_and_books_it(
    now: FakeNow,
) -> None:
    clock = StallClock(now)
    entered = asyncio.Event()

    async def call() -> None:
        with clock.attempting():
            now.advance(4.0)
            entered.set()
            await asyncio.Event().wait()  # never set: only cancellation ends it

    task = asyncio.create_task(call())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert clock.productive_s == 4.0


def test_every_productive_attempt_of_a_call_is_excluded(now: FakeNow) -> None:
    # Rule 1: each attempt that burns the retry budget is excluded, not only the latest.
    clock = StallClock(now)
    with clock.attempting():
        now.advance(10.0)
    now.advance(1.0)  # backoff
    with clock.attempting():
        now.advance(20.0)
    assert clock.productive_s == 30.0
    assert clock.stalled_s() == 1.0
