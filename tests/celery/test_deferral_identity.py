"""Regression tests of deferral under Celery features and faults, one per behaviour that
once lost or doubled a task (issue list of the feature-by-fault matrix)."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from celery import Celery

from polygate_celery import AllSourcesExhausted
from polygate_celery.celery import task_deferred
from polygate_celery.celery.parking import ParkingLot, Releaser, capture_message, lot_name
from polygate_celery.celery.task import EAGER_NOTE
from polygate_celery.celery.worker import start_release_loop
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import (
    app,
    ask,
    ask_kept,
    autoretry_unpublished,
    defer_then_autoretry,
    defer_then_exhaust,
    replaced_after_deferral,
    retry_never_published,
    retry_unencodable,
    retry_unpublished,
    witnessed,
)
from tests.celery.conftest import Worker, config_data
from tests.celery.test_outcomes import DEFER_PAUSE_S, pause, runs, wait_for_state
from tests.celery.test_worker_processes import running_pid, wait_until
from tests.celery.workers import celery_worker
from tests.redis_server import RedisServer


def lot_of(runtime: Any) -> ParkingLot:
    return ParkingLot(runtime.redis, runtime.keys, lot_name(app))


# 1. A run Celery terminates is not marked finished: the restored copy runs.
QUICK = {"POLYGATE_TEST_EXTRA_TASK_S": "1", "POLYGATE_TEST_VISIBILITY_MARGIN_S": "1"}


def test_a_run_ended_by_a_cold_shutdown_runs_again_from_its_restored_message(
    provider: SimulatedProvider, redis_url: str, broker: str, tmp_path: Path
) -> None:
    prefix = f"cold-{uuid.uuid4().hex[:8]}"
    data = config_data(provider, redis_url, prefix, extra_sources={"killable": "killable"})
    for scope in data["scopes"].values():
        scope["max_call_s"] = 2  # with QUICK: a 3 s soft shutdown, a 34 s visibility timeout
    app.conf.update(broker_url=broker, result_backend=broker, task_default_queue="polygate-tests")
    options = {"pool": "prefork", "concurrency": 1, "settings": QUICK}
    try:
        with celery_worker(data, broker, tmp_path, **options) as worker:  # type: ignore[arg-type]
            # Looks like a deferred task's later run: the marker that lost it before.
            result = ask_in_killable(headers={"polygate_deferrals": 1})
            running_pid(broker, result.id)
            wait_until(lambda: provider.in_flight("killable") == 1)
            os.kill(worker.pid, signal.SIGQUIT)  # cold shutdown (a soft one first) ...
            time.sleep(0.05)
            os.kill(worker.pid, signal.SIGQUIT)  # ... whose running tasks are cancelled now
            worker.wait(30)
        with celery_worker(data, broker, tmp_path, **options):  # type: ignore[arg-type]
            assert result.get(timeout=90) == "survived"
        assert runs(broker, result.id) == 2  # terminated, then run from the restored message
    finally:
        _clean(redis_url, prefix)


def ask_in_killable(**options: Any) -> Any:
    from tests.celery.app import ask_in  # noqa: PLC0415

    return ask_in.apply_async(("killable", "x"), **options)


# 2. autoretry_for after a deferral: the retry is a run of its own.
@pytest.mark.parametrize("task", [defer_then_autoretry, defer_then_exhaust], ids=lambda t: t.name)
def test_autoretry_after_a_deferral_runs_the_retry(
    governed_worker: Worker, broker: str, task: Any
) -> None:
    with governed_worker():
        result = task.delay()
        assert result.get(timeout=30) == "fine"
    assert runs(broker, result.id) == 3  # deferred, failed and retried, done


# 2b. A retry the broker does not take is handed back, not dropped (Celery rejects the
# message without requeueing it when the retry's publish fails).
@pytest.mark.parametrize("task", [retry_unpublished, autoretry_unpublished], ids=lambda t: t.name)
def test_a_retry_the_broker_did_not_take_runs_from_the_handed_back_message(
    governed_worker: Worker, broker: str, task: Any
) -> None:
    with governed_worker():
        result = task.delay()
        assert result.get(timeout=30) == "fine"
    assert runs(broker, result.id) == 3  # retry unpublished, handed back; retried; done


def test_a_retry_the_broker_never_takes_fails_at_the_redelivery_cap(
    governed_worker: Worker, broker: str
) -> None:
    with governed_worker(deferral={"redelivery_cap": 2}):
        result = retry_never_published.delay()
        failure = wait_for_state(result, "FAILURE", within_s=30)
    assert type(failure).__name__ == "PoisonMessage", failure
    assert runs(broker, result.id) == 3  # the first run, then two handed-back copies


def test_a_retry_that_cannot_be_encoded_is_not_handed_back(
    governed_worker: Worker, broker: str
) -> None:
    with governed_worker():
        result = retry_unencodable.delay()
        assert wait_for_state(result, "FAILURE")  # Celery's own conduct: rejected, failed
        time.sleep(1.0)  # a handed-back message would run again within this
    assert runs(broker, result.id) == 1


# 3. A task-sent event published after the task message is not what gets parked.
def test_sent_events_do_not_replace_the_parked_message(governed_worker: Worker) -> None:
    app.conf.task_send_sent_event = True
    try:
        with governed_worker() as runtime:
            pause(runtime, "main", DEFER_PAUSE_S)
            result = ask.delay("watched")
            assert wait_for_state(result, "DEFERRED")["strategy"] == "park"
            assert result.get(timeout=30) == "fine"
        message = capture_message(ask.s("x").set(task_id="probe"))
        assert message["headers"]["id"] == "probe"
        assert message["headers"]["task"] == ask.name
    finally:
        app.conf.task_send_sent_event = False


# 4. A copy of a live run (threads pool, broker blip) never runs beside it.
def test_a_copy_of_a_live_run_waits_instead_of_running_beside_it(
    governed_worker: Worker, broker: str
) -> None:
    overrides = {"extra_sources": {"killable": "killable"}, "deferral": {"heartbeat_s": 0.2}}
    with governed_worker(**overrides) as runtime:
        task_id, submission = uuid.uuid4().hex, uuid.uuid4().hex
        same = {"task_id": task_id, "headers": {"polygate_submission": submission}}
        first = witnessed.apply_async(**same)
        wait_until(lambda: _witness(broker, task_id))  # the first copy is running
        witnessed.apply_async(**same)  # the same message again, as a redelivery would be
        assert first.get(timeout=30) == "survived"
        wait_until(lambda: runtime.run(lot_of(runtime).size()) == 0, within_s=30)
        time.sleep(0.5)  # the copy, released, finds the run finished and is dropped
    assert [event.split()[0] for event in _witness(broker, task_id)] == ["start", "end"]


def _witness(broker: str, task_id: str) -> list[str]:
    values = sync_redis.Redis.from_url(broker).lrange(f"witness:{task_id}", 0, -1)
    return [v.decode() for v in values]


# 5. Two submissions of one task id; a replacement after a deferral.
def test_two_submissions_with_one_task_id_get_their_own_answers(governed_worker: Worker) -> None:
    task_id = uuid.uuid4().hex
    with governed_worker() as runtime:
        assert ask_kept.apply_async(("chat",), task_id=task_id).get(timeout=30) == "fine"
        # Celery's result backend keeps a SUCCESS: a client reusing an id forgets it first.
        ask_kept.AsyncResult(task_id).forget()
        pause(runtime, "other", DEFER_PAUSE_S)  # the second submission defers before it pays
        second = ask_kept.apply_async(("second",), task_id=task_id)
        wait_for_state(second, "DEFERRED")
        assert second.get(timeout=30) == "second answer"  # its own, not the first's "fine"


def test_a_replacement_after_a_deferral_runs(governed_worker: Worker) -> None:
    with governed_worker():
        result = replaced_after_deferral.delay()
        assert result.get(timeout=30) == "fine"


# 6. Apps with one name on two brokers keep separate lots.
def test_apps_with_one_name_on_two_brokers_park_in_lots_of_their_own() -> None:
    one = Celery("pipeline", broker="redis://:s3cret@127.0.0.1:6379/1")
    two = Celery("pipeline", broker="redis://:s3cret@127.0.0.1:6379/2")
    again = Celery("pipeline", broker="redis://:s3cret@127.0.0.1:6379/1")
    assert lot_name(one) != lot_name(two)
    assert lot_name(one) == lot_name(again)
    assert lot_name(one).startswith("pipeline@")
    assert "s3cret" not in lot_name(one)


# 7. Eager mode raises the verdict instead of re-enqueueing itself.
def test_eager_mode_raises_the_deferral_verdict(governed_worker: Worker, broker: str) -> None:
    with governed_worker() as runtime:
        pause(runtime, "main", 30)
        app.conf.task_always_eager = True
        try:
            result = ask.delay("eager")  # ran here, once: nothing re-enqueued itself
        finally:
            app.conf.task_always_eager = False
        assert result.state == "FAILURE"
        with pytest.raises(AllSourcesExhausted) as caught:
            result.get()
        with pytest.raises(AllSourcesExhausted) as direct:
            ask("called directly")  # no message either: raised, nothing marked
    assert caught.value.reason == "stalled"
    assert EAGER_NOTE in (caught.value.__notes__ or [])
    assert EAGER_NOTE in (direct.value.__notes__ or [])
    assert runs(broker, result.id) == 1


# 8. A malformed parked entry goes to the dead letters, once.
class Records(logging.Handler):
    """The package logger's records (a worker's logging setup may stop propagation)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, part: str) -> list[str]:
        return [r.getMessage() for r in self.records if part in r.getMessage()]


@pytest.fixture
def logged() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("polygate_celery")
    level = logger.level
    logger.setLevel(logging.DEBUG)  # a worker's start raises the root logger's level
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_malformed_parked_entry_goes_to_the_dead_letters_once(
    governed_worker: Worker, logged: Records
) -> None:
    with governed_worker(deferral={"release_interval_s": 60, "claim_lease_s": 0.2}) as runtime:
        lot = lot_of(runtime)
        client = sync_redis.Redis.from_url(runtime.config.store.redis_url.get_secret_value())
        for entry, text in (("not-json", "{nope"), ("empty", "{}"), ("list", json.dumps([1]))):
            client.zadd(lot.keys[0], {entry: 0})
            client.hset(lot.keys[1], entry, text)
        releaser = Releaser(app, lot, runtime.config.deferral)
        assert runtime.run(releaser.release_due()) == 0
        time.sleep(0.3)  # a claim lease would have ended
        assert runtime.run(releaser.release_due()) == 0
        dead = runtime.run(lot.dead_letters())
        assert sorted(dead) == ["empty", "list", "not-json"]
        assert dead["not-json"].startswith("not JSON")
        assert dead["empty"].startswith("missing body")
        assert runtime.run(lot.size()) == 0
        assert len(logged.messages("not a task message")) == 3
        client.delete(lot.dead)


# 9. An unreachable Redis: the release loop backs off and logs once per state change.
def test_an_unreachable_redis_backs_the_release_loop_off_and_logs_once(
    governed_worker: Worker, logged: Records
) -> None:
    with RedisServer() as store:
        settings = {"redis_url": store.url, "lease_s": 10, "socket_timeout_s": 0.2}
        with governed_worker(store=settings, deferral={"release_interval_s": 0.05}) as runtime:
            releaser = Releaser(app, lot_of(runtime), runtime.config.deferral)
            rounds = 0
            original = releaser.release_due

            async def counted(loop: Any = None) -> int:
                nonlocal rounds
                rounds += 1
                return await original(loop)

            releaser.release_due = counted  # type: ignore[method-assign]
            store.kill()
            releaser.start(runtime.loop)
            time.sleep(3.0)
            failing_rounds = rounds
            store.start()
            wait_until(lambda: logged.messages("works again"), within_s=40)
            releaser.stop()
    assert len(logged.messages("releasing parked tasks failed")) == 1
    # Without backoff: a round every 25-50 ms, 60-120 in 3 s; with it, doubling from 50 ms.
    assert failing_rounds <= 12


# 10. Monitoring: a deferral event with its due time, then task-succeeded once.
def test_a_deferred_task_emits_a_deferral_event_then_succeeds_once(
    governed_worker: Worker,
) -> None:
    events: list[dict[str, Any]] = []
    signalled: list[dict[str, Any]] = []
    ready = threading.Event()

    def on_deferred(sender: Any = None, **fields: Any) -> None:
        signalled.append(fields)

    def ours(task_id: str) -> list[dict[str, Any]]:
        """This task's deferrals (a task of an earlier test may still be deferred here)."""
        return [s for s in signalled if s["task_id"] == task_id]

    task_deferred.connect(on_deferred)
    app.conf.worker_send_task_events = True
    try:
        stop = threading.Event()
        listener = threading.Thread(target=_listen, args=(events, ready, stop), daemon=True)
        with governed_worker() as runtime:
            try:
                listener.start()
                _until_subscribed(ready)
                pause(runtime, "main", DEFER_PAUSE_S)
                result = ask.delay("monitored")
                assert result.get(timeout=30) == "fine"
                wait_until(lambda: _of(events, result.id, "task-succeeded"), within_s=30)
                # a deferral's event and the success's come by different producers: either
                # may arrive last (each deferral signalled here has its event on the way)
                wait_until(
                    lambda: len(_of(events, result.id, "task-deferred")) >= len(ours(result.id)),
                    within_s=30,
                )
                time.sleep(0.5)
            finally:  # the listener stops while the broker still answers, pass or fail
                stop.set()
                listener.join(10)
    finally:
        app.conf.worker_send_task_events = False
        task_deferred.disconnect(on_deferred)
    deferred = _of(events, result.id, "task-deferred")
    assert deferred, "no task-deferred event"
    assert all(e["due_at"] > e["timestamp"] - 1 and e["reason"] == "stalled" for e in deferred)
    assert len(_of(events, result.id, "task-succeeded")) == 1
    assert len(ours(result.id)) == len(deferred)


def _until_subscribed(ready: threading.Event) -> None:
    """Send probe events until the listener has heard one: events on Redis are pub/sub
    messages, and one sent before the listener subscribed is heard by nobody (on a busy
    machine the subscription came more than half a second after the listener began)."""
    with app.events.default_dispatcher() as dispatcher:
        deadline = time.monotonic() + 30
        while not ready.wait(0.2):
            assert time.monotonic() < deadline, "the event listener never subscribed"
            dispatcher.send("polygate-probe")


def _listen(events: list[dict[str, Any]], ready: threading.Event, stop: threading.Event) -> None:
    def heard(event: dict[str, Any]) -> None:
        if event.get("type") == "polygate-probe":
            ready.set()
        else:
            events.append(event)

    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": heard})
        # One subscription for the whole test, stopped between two drains (one a second):
        # events on Redis are pub/sub messages, and a listener that timed out and
        # subscribed again missed an event sent in between.
        receiver.on_iteration = lambda: setattr(receiver, "should_stop", stop.is_set())
        receiver.capture(limit=None, timeout=None, wakeup=False)


def _of(events: list[dict[str, Any]], task_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("uuid") == task_id and e.get("type") == kind]


def _clean(redis_url: str, prefix: str) -> None:
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)


def test_a_lot_parked_by_an_earlier_version_is_released(
    governed_worker: Worker, provider: SimulatedProvider, redis_url: str
) -> None:
    """Before lots were named by broker, a lot was ``parked:<main>``: still released."""
    with governed_worker() as runtime:
        legacy = ParkingLot(runtime.redis, runtime.keys, app.main or "default")
        message = capture_message(ask.s("parked long ago").set(task_id=uuid.uuid4().hex))
        runtime.run(legacy.park(f"{message['headers']['id']}:1", 0.0, message, 60.0))
    with governed_worker():
        start_release_loop(app)  # as a worker process does at start (worker_process_init)
        assert ask.AsyncResult(message["headers"]["id"]).get(timeout=30) == "fine"


def test_a_released_message_the_broker_lost_is_released_again(governed_worker: Worker) -> None:
    """The release keeps the entry until its run begins: a message lost in delivery (a
    Redis restart cutting off kombu's BRPOP reply) is released again."""
    settings = {"release_interval_s": 60, "release_check_s": 0.5}
    with governed_worker(deferral=settings) as runtime:
        pause(runtime, "main", DEFER_PAUSE_S)
        result = ask.delay("lost in delivery")
        wait_for_state(result, "DEFERRED")
        time.sleep(DEFER_PAUSE_S + 1.0)  # due now
        lot = lot_of(runtime)
        ((entry, _),) = runtime.run(lot.claim(10, 30.0, "a-releaser"))
        # Published, then lost by the broker: confirmed, but no run ever begins.
        assert runtime.run(lot.confirm(entry, "a-releaser", 0.5))
        assert runtime.run(lot.size()) == 1  # kept until its run begins
        time.sleep(0.7)
        releaser = Releaser(app, lot, runtime.config.deferral)
        assert runtime.run(releaser.release_due()) == 1  # due again: released again
        assert result.get(timeout=20) == "fine"
        wait_until(lambda: runtime.run(lot.size()) == 0, within_s=10)  # its run forgot it
        assert runtime.run(lot.client.hgetall(lot.keys[1])) == {}  # and its release count
