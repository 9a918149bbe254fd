"""Which result backends a stored chord part is counted on, and what the count is given."""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import celery.backends
import celery.backends.redis as redis_backend
import pytest
from celery import Celery
from celery.backends.base import DisabledBackend
from celery.backends.cache import CacheBackend
from celery.backends.redis import RedisBackend

from polygate_celery.celery import chords
from polygate_celery.celery.chords import (
    RECOUNT_SLACK_S,
    RECOUNTS,
    REQUEST,
    claim_held_s,
    count_stored_part,
    counts_each_part_once,
    install_counting_request,
    polls_stored_results,
)


class CountingRedis(RedisBackend):  # type: ignore[misc]
    """Celery's Redis backend on a real Redis, its counts recorded instead of run (the
    dispatch claim they would leave is set by the test)."""

    def __init__(self, app: Celery, url: str) -> None:
        super().__init__(app=app, url=url)
        self.counted: list[tuple[str, str, Any]] = []

    def on_chord_part_return(self, request: Any, state: str, result: Any, **_: Any) -> None:
        self.counted.append((request.id, state, result))


def _task(backend: Any) -> Any:
    return SimpleNamespace(backend=backend)


def _member(**extra: Any) -> Any:
    return SimpleNamespace(id="t1", group=GROUP, chord={"task": "body"}, **extra)


GROUP = f"chord-parts-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def counting(redis_url: str) -> Iterator[CountingRedis]:
    backend = CountingRedis(Celery("chords"), redis_url)
    yield backend
    backend.client.delete(backend.get_key_for_group(GROUP, ".c"))


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, tuple[Any, ...]]]:
    """Later counts recorded instead of started (no real time passes)."""
    started: list[tuple[float, tuple[Any, ...]]] = []

    class Timer:
        def __init__(self, delay: float, function: Any, args: tuple[Any, ...]) -> None:
            self.daemon = False
            self.delay, self.function, self.args = delay, function, args

        def start(self) -> None:
            assert self.daemon
            assert self.function is chords._count
            started.append((self.delay, self.args))

    monkeypatch.setattr(chords.threading, "Timer", Timer)
    return started


def test_celerys_redis_backend_counts_each_part_once() -> None:
    app = Celery("chords")
    assert counts_each_part_once(RedisBackend(app=app, url="redis://127.0.0.1:1/0"))
    assert not polls_stored_results(RedisBackend(app=app, url="redis://127.0.0.1:1/0"))


def test_a_backend_that_polls_stored_results_needs_no_count(counting: CountingRedis) -> None:
    assert polls_stored_results(DisabledBackend(app=Celery("chords")))
    assert not polls_stored_results(counting)


@pytest.mark.parametrize("status", ["SUCCESS", "FAILURE"])
def test_a_stored_outcome_of_a_chord_member_is_counted_with_its_state(
    status: str, counting: CountingRedis, timers: list[Any]
) -> None:
    count_stored_part(_task(counting), _member(), {"status": status, "result": "r"})
    assert counting.counted == [("t1", status, "r")]
    assert timers == []  # no dispatch claim held: nothing to count later


@pytest.mark.parametrize(
    ("member", "meta"),
    [
        (SimpleNamespace(id="t1", group=None, chord=None), {"status": "SUCCESS"}),  # no chord
        (SimpleNamespace(id="t1", group="g1", chord=None), {"status": "SUCCESS"}),  # a group
        (_member(), {"status": "STARTED"}),  # not an outcome
    ],
)
def test_nothing_else_is_counted(
    member: Any, meta: dict[str, Any], counting: CountingRedis, timers: list[Any]
) -> None:
    count_stored_part(_task(counting), member, meta)
    assert counting.counted == []
    assert timers == []


def test_a_backend_that_may_count_twice_gets_a_warning_naming_the_chord(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("chords")
    backend = CacheBackend(app=app, backend="memory://")
    assert not counts_each_part_once(backend)
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        count_stored_part(_task(backend), _member(), {"status": "SUCCESS", "result": 1})
    (message,) = _warnings(caplog)
    assert message.startswith(f"task t1 of chord {GROUP}: its outcome is stored")
    assert "this result backend may count a part twice" in message


def _warnings(caplog: pytest.LogCaptureFixture, *, exc_info: bool = False) -> list[str]:
    """The package's warnings, formatted (a broken format raises here); each with the
    exception it was logged with where `exc_info`, else none."""
    records = [r for r in caplog.records if r.name == "polygate_celery"]
    assert all(r.levelno == logging.WARNING for r in records)
    assert all(isinstance(r.exc_info, tuple) is exc_info for r in records)
    return [r.getMessage() for r in records]


def test_without_celerys_redis_backend_no_backend_counts_each_part_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where Celery's Redis backend cannot be imported, or its chord script is not the
    one that remembers each part, no backend is trusted to count a part once."""
    backend = RedisBackend(app=Celery("chords"), url="redis://127.0.0.1:1/0")
    monkeypatch.setattr(redis_backend, "CHORD_PART_RETURN_LUA", "redis.call('INCR', KEYS[1])")
    assert not counts_each_part_once(backend)
    monkeypatch.delattr(redis_backend, "CHORD_PART_RETURN_LUA")
    assert not counts_each_part_once(backend)
    monkeypatch.delattr(celery.backends, "redis")
    monkeypatch.setitem(sys.modules, "celery.backends.redis", None)
    assert not counts_each_part_once(backend)


def test_a_count_that_fails_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture, redis_url: str
) -> None:
    class Broken(CountingRedis):
        def on_chord_part_return(self, *_: Any, **__: Any) -> None:
            raise ConnectionError("down")

    backend = Broken(Celery("chords"), redis_url)
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        count_stored_part(_task(backend), _member(), {"status": "SUCCESS"})
    (message,) = _warnings(caplog, exc_info=True)
    assert message.startswith(f"task t1 of chord {GROUP}: counting its stored outcome")
    assert "toward the chord failed" in message


def test_a_claim_that_cannot_be_read_is_logged_after_the_count(
    counting: CountingRedis,
    timers: list[Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreadable(*_: Any) -> float | None:
        raise ConnectionError("down")

    monkeypatch.setattr(chords, "claim_held_s", unreadable)
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        count_stored_part(_task(counting), _member(), {"status": "SUCCESS", "result": "r"})
    assert counting.counted == [("t1", "SUCCESS", "r")]
    assert timers == []
    (message,) = _warnings(caplog, exc_info=True)
    assert message.startswith(f"task t1 of chord {GROUP}: counted, but the chord's dispatch")
    assert "claim could not be read" in message


def test_a_request_without_chord_fields_is_not_a_chord_member(
    counting: CountingRedis, timers: list[Any]
) -> None:
    count_stored_part(_task(counting), SimpleNamespace(id="t1"), {"status": "SUCCESS"})
    assert counting.counted == []


@pytest.mark.parametrize("chord", [None, "body", ["body"]])
def test_a_chord_without_a_body_id_has_no_body_state(counting: CountingRedis, chord: Any) -> None:
    assert not chords.body_has_state(counting, chord)


def test_a_dispatch_claim_left_held_is_counted_again_once_it_ran_out(
    counting: CountingRedis,
    timers: list[tuple[float, tuple[Any, ...]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The chord is complete and its dispatch claimed by a process that may be gone
    (lost while it sent the body): the part is counted again after the claim's time."""
    key = counting.get_key_for_group(GROUP, ".c")
    counting.client.set(key, "a-claim-token", ex=600)
    held_before = claim_held_s(counting, GROUP)
    count_stored_part(_task(counting), _member(), {"status": "SUCCESS", "result": "r"})
    held_after = claim_held_s(counting, GROUP)
    assert held_before is not None
    assert held_after is not None
    assert len(timers) == 1
    delay, args = timers[0]
    assert held_after + RECOUNT_SLACK_S <= delay <= held_before + RECOUNT_SLACK_S
    assert args[1:] == (_member(), "SUCCESS", "r", RECOUNTS - 1)
    # each later count, the claim still held: one more, until the recounts are spent
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        while len(timers) < RECOUNTS + 1 and timers[-1][1][-1] >= 0:
            before = len(timers)
            chords._count(*timers[-1][1])
            if len(timers) == before:
                break
    assert [a[-1] for _, a in timers] == list(range(RECOUNTS - 1, -1, -1))
    assert len(counting.counted) == RECOUNTS + 1
    (message,) = _warnings(caplog)
    assert message.startswith(f"task t1 of chord {GROUP}: the chord's dispatch is still")
    assert f"claimed after {RECOUNTS} later counts" in message
    # the body sent: the claim marked done, nothing more to count
    timers.clear()
    counting.client.set(key, "done", ex=300)
    chords._count(*args)
    assert timers == []


def test_claim_held_reads_celerys_dispatch_claim(counting: CountingRedis) -> None:
    key = counting.get_key_for_group(GROUP, ".c")
    assert claim_held_s(counting, GROUP) is None  # not complete yet
    counting.client.set(key, "token", px=2500)
    held = claim_held_s(counting, GROUP)
    assert held is not None
    assert 0 < held <= 2.5
    counting.client.set(key, "token", px=100_000_000)
    held = claim_held_s(counting, GROUP)
    assert held is not None
    assert 99_990 < held <= 100_000  # milliseconds read as seconds
    counting.client.set(key, "token")  # a claim without a time: held for 0 s more
    assert claim_held_s(counting, GROUP) == 0.0
    counting.client.set(key, "done", ex=300)
    assert claim_held_s(counting, GROUP) is None


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


def test_a_later_count_is_skipped_where_the_body_has_a_state(
    counting: CountingRedis, timers: list[Any]
) -> None:
    """The claim's holder sent the body and was lost before it marked the chord done:
    a worker has the body (its state is stored), so no later count sends it again."""
    body_id = f"body-{uuid.uuid4().hex[:12]}"
    member = SimpleNamespace(
        id="t1", group=GROUP, chord={"task": "body", "options": {"task_id": body_id}}
    )
    chords._count(counting, member, "SUCCESS", "r", RECOUNTS - 1)  # no state yet: counted
    assert len(counting.counted) == 1
    counting.store_result(body_id, None, "STARTED")
    try:
        chords._count(counting, member, "SUCCESS", "r", RECOUNTS - 1)
        assert len(counting.counted) == 1
        chords._count(counting, member, "SUCCESS", "r", RECOUNTS)  # a first count: made
        assert len(counting.counted) == 2
    finally:
        counting.forget(body_id)


@pytest.mark.parametrize("decoded", [False, True])
def test_celerys_own_count_against_a_held_and_a_free_dispatch_claim(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, decoded: bool
) -> None:
    """Celery's real chord script: a count that completes the chord while another
    process holds the dispatch claim sends nothing and leaves the claim read as held;
    once the claim is gone, the same count claims it, sends the body once and marks
    the chord done."""
    url = f"{redis_url}?decode_responses=true" if decoded else redis_url
    app = Celery("chords", backend=url)
    backend = app.backend
    group = f"chord-parts-{uuid.uuid4().hex[:12]}"
    sent: list[Any] = []
    monkeypatch.setattr(app.amqp, "_retry_publish", lambda publish, *a, **k: sent.append(a))
    member = SimpleNamespace(
        id="m1",
        group=group,
        group_index=0,
        chord=app.signature("body", options={"task_id": "b1"}),
    )
    claim = backend.get_key_for_group(group, ".c")
    try:
        backend.set_chord_size(group, 1)
        backend.client.set(claim, "another-process", ex=30)
        backend.on_chord_part_return(member, "SUCCESS", "r")
        assert sent == []
        held = claim_held_s(backend, group)
        assert held is not None
        assert 0 < held <= 30
        backend.client.delete(claim)
        backend.on_chord_part_return(member, "SUCCESS", "r")
        assert len(sent) == 1
        assert claim_held_s(backend, group) is None  # done
    finally:
        backend.client.delete(
            claim, *(backend.get_key_for_group(group, k) for k in (".j", ".t", ".s", ".d"))
        )
