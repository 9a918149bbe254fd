"""A finished run waits out a Redis restart before giving up on recording it."""

from __future__ import annotations

import logging

import pytest
import redis

from polygate_celery.celery.guard import patiently
from polygate_celery.errors import GovernanceBackendError


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
    calls, step = failing(4, redis.exceptions.ConnectionError("restarting"))
    patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert len(calls) == 5
    assert clock.slept == [0.1, 0.2, 0.4, 0.8]


def test_it_gives_up_after_its_patience_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    _calls, step = failing(10_000, redis.exceptions.TimeoutError("down"))
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


def test_an_unreachable_redis_behind_a_store_error_is_waited_out() -> None:
    """The run markers' scripts raise `GovernanceBackendError` with Redis's error as its
    cause: that is the error patience is for."""
    clock = Clock()
    cause = redis.exceptions.ConnectionError("Connection refused")
    wrapped = GovernanceBackendError(f"ConnectionError: {cause}")
    wrapped.__cause__ = cause
    calls, step = failing(2, wrapped)
    patiently(step, within_s=30, sleep=clock.sleep, clock=lambda: clock.now)  # type: ignore[arg-type]
    assert (len(calls), clock.slept) == (3, [0.1, 0.2])
