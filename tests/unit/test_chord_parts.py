"""Which result backends a stored chord part is counted on, and what the count is given."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.backends.base import DisabledBackend
from celery.backends.cache import CacheBackend
from celery.backends.redis import RedisBackend

from polygate_celery.celery.chords import (
    REQUEST,
    count_stored_part,
    counts_each_part_once,
    install_counting_request,
    polls_stored_results,
)


class CountingRedis(RedisBackend):  # type: ignore[misc]
    """Celery's Redis backend, its counts recorded instead of run (no server needed to
    decide whether to count)."""

    def __init__(self, app: Celery) -> None:
        super().__init__(app=app, url="redis://127.0.0.1:1/0")
        self.counted: list[tuple[str, str, Any]] = []

    def on_chord_part_return(self, request: Any, state: str, result: Any, **_: Any) -> None:
        self.counted.append((request.id, state, result))


def _task(backend: Any) -> Any:
    return SimpleNamespace(backend=backend)


def _member(**extra: Any) -> Any:
    return SimpleNamespace(id="t1", group="g1", chord={"task": "body"}, **extra)


def test_celerys_redis_backend_counts_each_part_once() -> None:
    app = Celery("chords")
    assert counts_each_part_once(RedisBackend(app=app, url="redis://127.0.0.1:1/0"))
    assert not polls_stored_results(RedisBackend(app=app, url="redis://127.0.0.1:1/0"))


def test_a_backend_that_polls_stored_results_needs_no_count() -> None:
    app = Celery("chords")
    assert polls_stored_results(DisabledBackend(app=app))
    backend = CountingRedis(app)
    assert not polls_stored_results(backend)


@pytest.mark.parametrize("status", ["SUCCESS", "FAILURE"])
def test_a_stored_outcome_of_a_chord_member_is_counted_with_its_state(status: str) -> None:
    backend = CountingRedis(Celery("chords"))
    count_stored_part(_task(backend), _member(), {"status": status, "result": "r"})
    assert backend.counted == [("t1", status, "r")]


@pytest.mark.parametrize(
    ("member", "meta"),
    [
        (SimpleNamespace(id="t1", group=None, chord=None), {"status": "SUCCESS"}),  # no chord
        (SimpleNamespace(id="t1", group="g1", chord=None), {"status": "SUCCESS"}),  # a group
        (_member(), {"status": "STARTED"}),  # not an outcome
    ],
)
def test_nothing_else_is_counted(member: Any, meta: dict[str, Any]) -> None:
    backend = CountingRedis(Celery("chords"))
    count_stored_part(_task(backend), member, meta)
    assert backend.counted == []


def test_a_backend_that_may_count_twice_gets_a_warning_naming_the_chord(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("chords")
    backend = CacheBackend(app=app, backend="memory://")
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        count_stored_part(_task(backend), _member(), {"status": "SUCCESS", "result": 1})
    assert "chord g1" in caplog.text
    assert "task t1" in caplog.text


def test_a_count_that_fails_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(CountingRedis):
        def on_chord_part_return(self, *_: Any, **__: Any) -> None:
            raise ConnectionError("down")

    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        count_stored_part(_task(Broken(Celery("chords"))), _member(), {"status": "SUCCESS"})
    assert "counting its stored outcome toward the chord failed" in caplog.text


def test_the_counting_request_replaces_only_celerys_own() -> None:
    app = Celery("chords")

    # (shared=False: a shared task would join every app finalized later in this process)
    @app.task(shared=False)
    def plain() -> None: ...

    @app.task(shared=False, Request="somewhere:Custom")
    def custom() -> None: ...

    changed = install_counting_request(app.tasks)
    assert plain.name in changed
    assert custom.name not in changed
    assert plain.Request == REQUEST
    assert custom.Request == "somewhere:Custom"
