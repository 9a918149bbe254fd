"""The parking lot's release: at least once, never lost, never doubled by the release itself."""

from __future__ import annotations

import time
from typing import Any

import redis as sync_redis
from celery import signals

from polygate_celery.celery.parking import ParkingLot, Releaser, lot_name
from tests.celery.app import app, ask, record
from tests.celery.conftest import Worker
from tests.celery.test_outcomes import DEFER_PAUSE_S, pause, runs, wait_for_state


def lot_of(runtime: Any) -> ParkingLot:
    return ParkingLot(runtime.redis, runtime.keys, lot_name(app))


def test_a_releaser_that_dies_mid_release_loses_nothing(
    governed_worker: Worker, broker: str
) -> None:
    with governed_worker(deferral={"release_interval_s": 60, "claim_lease_s": 1.0}) as runtime:
        pause(runtime, "main", DEFER_PAUSE_S)
        result = ask.delay("parked")
        wait_for_state(result, "DEFERRED")
        time.sleep(DEFER_PAUSE_S + 1.0)  # due now
        lot = lot_of(runtime)
        claimed = runtime.run(lot.claim(10, 1.0, "a-releaser-that-dies"))
        ((entry, _),) = claimed
        assert entry.startswith(f"{result.id}:")
        assert entry.endswith(":1:0")  # deferral 1, no retry
        time.sleep(1.2)  # its claim lapses, unconfirmed
        other = Releaser(app, lot, runtime.config.deferral)
        assert runtime.run(other.release_due()) == 1
        assert result.get(timeout=20) == "fine"
        assert runtime.run(lot.size()) == 0


def test_a_message_released_twice_runs_once(governed_worker: Worker, broker: str) -> None:
    failures: list[str] = []

    def failed(task_id: str = "", **_: Any) -> None:
        failures.append(task_id)

    signals.task_failure.connect(failed, weak=False)
    try:
        released_twice(governed_worker, broker, failures)
    finally:
        signals.task_failure.disconnect(failed)


def released_twice(governed_worker: Worker, broker: str, failures: list[str]) -> None:
    with governed_worker(deferral={"release_interval_s": 60}) as runtime:
        pause(runtime, "main", DEFER_PAUSE_S)
        result = ask.delay("twice")
        wait_for_state(result, "DEFERRED")
        time.sleep(DEFER_PAUSE_S + 1.0)  # due now
        lot = lot_of(runtime)
        ((_, message),) = runtime.run(lot.claim(10, 30.0, "first"))
        from polygate_celery.celery.parking import publish_message  # noqa: PLC0415

        publish_message(app, message)  # a releaser published, then died before confirming
        assert result.get(timeout=20) == "fine"
        publish_message(app, message)  # ... and its successor publishes the same message again
        consumed(broker, app.conf.task_default_queue)  # the second copy was read and acked
    assert runs(broker, result.id) == 2  # the first run, then the released one, once
    stored = app.AsyncResult(result.id)  # read again from the backend: the copy changed nothing
    assert (stored.state, stored.result) == ("SUCCESS", "fine")
    assert result.id not in failures  # the copy was dropped, not run into an error


def consumed(broker: str, queue: str, within_s: float = 30) -> None:
    """Wait until `queue` is empty and no message of it is unacknowledged."""
    client = sync_redis.Redis.from_url(broker)
    deadline = time.monotonic() + within_s
    while client.llen(queue) or client.hlen("unacked"):
        assert time.monotonic() < deadline, "the message was never consumed"
        time.sleep(0.05)


def test_the_release_loop_keeps_up(governed_worker: Worker, broker: str) -> None:
    """40 tasks parked at once all come back, and each deferral is released once: a
    task's runs carry the deferral numbers 0, 1, ..., n, none twice."""
    with governed_worker() as runtime:
        pause(runtime, "main", DEFER_PAUSE_S)
        results = [record.delay(f"n{i}") for i in range(40)]
        assert [r.get(timeout=60) for r in results] == ["fine"] * 40
        assert runtime.run(lot_of(runtime).size()) == 0
    client = sync_redis.Redis.from_url(broker)
    numbers = [[int(x) for x in client.lrange(f"deferrals:{r.id}", 0, -1)] for r in results]
    assert all(runs == list(range(len(runs))) for runs in numbers), numbers
    assert any(len(runs) > 1 for runs in numbers)  # the pause did park tasks
