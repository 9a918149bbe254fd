"""A finished run waits out a Redis restart before giving up on recording it.

The run markers' scripts raise what the store layer translates Redis's errors to:
`StoreUnreachable` is the error patience is for.
"""

from __future__ import annotations

import logging

import pytest

from polygate_celery.celery.guard import patiently
from polygate_celery.errors import GovernanceBackendError, StoreReplyError, StoreUnreachable


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(times: int, error: Exception) -> tuple[list[int], object]:
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) <= times:
            raise error

    return calls, step


def test_an_unreachable_redis_is_waited_out() -> None:
    clock = Clock()
    calls, step = failing(4, StoreUnreachable("ConnectionError: restarting"))
    patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert len(calls) == 5
    assert clock.slept == [0.1, 0.2, 0.4, 0.8]


def test_it_gives_up_after_its_patience_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    _calls, step = failing(10_000, StoreUnreachable("TimeoutError: Timeout reading from socket"))
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert 28 <= clock.now <= 30
    assert max(clock.slept) == 2.0
    assert [r.message for r in caplog.records if "Redis unreachable" in r.message] != []
    assert len(caplog.records) == 1


def test_any_other_error_is_logged_at_once() -> None:
    clock = Clock()
    calls, step = failing(1, ValueError("a bug"))
    patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert (len(calls), clock.slept) == (1, [])


def test_a_store_error_of_another_kind_is_logged_at_once() -> None:
    """Neither unreachable nor a bad reply (credentials refused): waiting would not mend it."""
    clock = Clock()
    calls, step = failing(1, GovernanceBackendError("AuthenticationError: invalid password"))
    patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert (len(calls), clock.slept) == (1, [])


def test_redis_loading_its_data_is_waited_out() -> None:
    clock = Clock()
    calls, step = failing(2, StoreUnreachable("BusyLoadingError: Redis is loading"))
    patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert (len(calls), clock.slept) == (3, [0.1, 0.2])


def test_any_other_error_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    _calls, step = failing(1, ValueError("a bug"))
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    (record,) = caplog.records
    assert record.getMessage() == "recording a governed task's run failed"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)


def test_giving_up_says_how_long_it_waited_and_what_may_follow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    _calls, step = failing(10_000, StoreUnreachable("ConnectionError: down"))
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        patiently(step, within_s=7.5, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == [
        "recording a governed task's run failed for 7.5s: Redis unreachable; a copy of its "
        "message may run again"
    ]


def test_a_try_that_falls_exactly_at_the_end_of_its_patience_is_made() -> None:
    clock = Clock()
    calls, step = failing(10_000, StoreUnreachable("ConnectionError: down"))
    # The second try falls at 0.1 + 0.2 (as floats add them): exactly the deadline.
    patiently(step, within_s=0.1 + 0.2, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert (len(calls), clock.slept) == (3, [0.1, 0.2])


def test_a_store_error_that_is_not_an_unreachable_redis_is_logged_at_once() -> None:
    """A script's own error, wrapped by the store: waiting would not mend it."""
    clock = Clock()
    calls, step = failing(1, StoreReplyError("ResponseError: a script failed"))
    patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert (len(calls), clock.slept) == (1, [])
