"""RabbitMQ as the broker, with the Redis store and result backend: the outcome rows and the
deferral path (both strategies) with a real worker, and the release's publisher confirms.

The broker is a vhost of the session's own on this machine's RabbitMQ
(`tests.celery.rabbitmq`); the store is the test Redis under a key prefix of each
test's own, the results a private Redis of each test's own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis as sync_redis
from amqp.exceptions import MessageNacked
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu import Queue

from polygate_celery import AllSourcesExhausted, DeferralBudgetExceeded, SourceFatalError
from polygate_celery.celery import DEFERRED, configure_worker
from polygate_celery.celery.parking import (
    ParkingLot,
    Releaser,
    capture_message,
    lot_name,
    publish_message,
)
from polygate_celery.celery.runtime import reset_runtime, runtime_for
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.outcome_rows import outcome_config, outcome_models, outcome_tasks
from tests.conftest import drop_result_subscriptions, own_redis
from tests.redis_server import RedisServer

QUEUE = "polygate-rabbitmq"

# An app of its own: a producer pool sticks to the first broker it used.
app = Celery("polygate_rabbitmq")
tasks = outcome_tasks(app)


def until(condition: Callable[[], bool], within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.05)


def wait_for_state(result: Any, state: str, within_s: float = 30) -> dict[str, Any]:
    until(lambda: result.state == state, within_s)
    return result.info or {}


@pytest.fixture(scope="module")
def results() -> Iterator[str]:
    with own_redis() as url:
        yield url
        drop_result_subscriptions(app)


@pytest.fixture(scope="module")
def provider() -> Iterator[SimulatedProvider]:
    with SimulatedProvider(outcome_models()) as provider:
        yield provider


Configure = Callable[..., Any]


@pytest.fixture
def configured(
    rabbitmq_vhost: str, results: str, redis_url: str, provider: SimulatedProvider
) -> Iterator[Configure]:
    """Configure the app for the vhost and the test Redis, with deferral settings of the
    test's own; returns its runtime. The test's store keys are deleted afterwards."""
    prefix = f"rabbitmq-{uuid.uuid4().hex[:10]}"

    def configure(store: RedisServer | None = None, **deferral: Any) -> Any:
        config = outcome_config(store.url if store else redis_url, prefix, provider.url)
        if store is not None:  # quick to give up on a store that stops answering
            update = {"lease_s": 10.0, "socket_timeout_s": 0.5}
            config = config.model_copy(update={"store": config.store.model_copy(update=update)})
        if deferral:
            config = config.model_copy(
                update={"deferral": config.deferral.model_copy(update=deferral)}
            )
        app.conf.update(broker_url=rabbitmq_vhost, result_backend=results, task_default_queue=QUEUE)
        app.conf.broker_transport_options = {}
        configure_worker(app, config, extra_task_s=20)
        reset_runtime(app)
        return runtime_for(app)

    yield configure
    reset_runtime(app)
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)


@pytest.fixture
def rabbit_worker(configured: Configure) -> Callable[..., Any]:
    """Start an in-process worker (threads pool) on the vhost; yields the runtime."""

    @contextmanager
    def start(store: RedisServer | None = None, **deferral: Any) -> Iterator[Any]:
        runtime = configured(store, **deferral)
        with start_worker(
            app, pool="threads", concurrency=4, perform_ping_check=False, shutdown_timeout=30
        ):
            yield runtime

    return start


def pause(runtime: Any, source: str, seconds: float) -> None:
    runtime.run(runtime.store.pause_source(source, seconds))


def test_the_worker_is_configured_for_rabbitmq(configured: Configure) -> None:
    configured()
    options = app.conf.broker_transport_options
    assert options == {"confirm_publish": True}  # no visibility timeout, no restore throttle
    with app.producer_pool.acquire(block=True) as producer:
        assert producer.connection.connection.confirm_publish is True  # py-amqp's connection


def test_one_outcome_per_row(rabbit_worker: Callable[..., Any]) -> None:
    with rabbit_worker() as runtime:
        assert tasks.answer.delay().get(timeout=60) == "fine"  # success
        pause(runtime, "main", 3.0)  # longer than the 1 s stall window
        stalled = tasks.answer.delay()
        meta = wait_for_state(stalled, DEFERRED)
        assert meta["reason"] == "stalled"
        assert meta["deferrals"] >= 1
        assert stalled.get(timeout=60) == "fine"  # the same task id, run again
        assert tasks.runs[stalled.id] >= 2  # = deferrals + 1
        exhausted = tasks.answer_down.delay()
        with pytest.raises(AllSourcesExhausted) as caught:
            exhausted.get(timeout=60)
        assert (caught.value.reason, caught.value.attempts) == ("retry_exhausted", 2)
        assert exhausted.state == "FAILURE"
        refused = tasks.refuse.delay()
        with pytest.raises(SourceFatalError, match="malformed"):
            refused.get(timeout=60)
        assert refused.state == "FAILURE"


def test_an_unreachable_store_defers_the_task(rabbit_worker: Callable[..., Any]) -> None:
    """The governance store stops answering, the broker does not: the task is deferred
    (`backend_error`) through the broker and succeeds once the store is back."""
    with RedisServer() as store, rabbit_worker(store):
        store.pause()
        result = tasks.answer.delay()
        assert wait_for_state(result, DEFERRED)["reason"] == "backend_error"
        store.resume()
        assert result.get(timeout=60) == "fine"
    assert tasks.runs[result.id] == 1  # the deferring run met the store before the body


def test_a_deferral_budget_spent_by_age_fails_the_task(rabbit_worker: Callable[..., Any]) -> None:
    with rabbit_worker(max_defer_age_s=3) as runtime:
        pause(runtime, "main", 120)
        result = tasks.answer.delay()
        with pytest.raises(DeferralBudgetExceeded) as caught:
            result.get(timeout=60)
    assert caught.value.reason == "stalled"
    assert caught.value.age_s > 3  # ended by its age, well before the 25 deferrals allowed
    assert 1 <= caught.value.deferrals < 25


def test_a_spent_deferral_budget_fails_the_task(rabbit_worker: Callable[..., Any]) -> None:
    with rabbit_worker(max_deferrals=1) as runtime:
        pause(runtime, "main", 120)
        result = tasks.answer.delay()
        with pytest.raises(DeferralBudgetExceeded) as caught:
            result.get(timeout=60)
    assert (caught.value.reason, caught.value.deferrals) == ("stalled", 1)
    assert tasks.runs[result.id] == 2  # the deferred run and the one that found it spent


@pytest.mark.parametrize("strategy", ["park", "countdown"])
def test_a_deferred_task_comes_back_with_its_id_and_runs_once(
    rabbit_worker: Callable[..., Any], strategy: str
) -> None:
    with rabbit_worker(strategy=strategy) as runtime:
        pause(runtime, "main", 1.0)
        result = tasks.answer.delay(fail_fast=True)
        meta = wait_for_state(result, DEFERRED)
        assert (meta["reason"], meta["strategy"]) == ("fail_fast", strategy)
        assert result.get(timeout=60) == "fine"
        lot = ParkingLot(runtime.redis, runtime.keys, lot_name(app))
        until(lambda: runtime.run(lot.size()) == 0)  # the run that began forgot its entry
        time.sleep(2.0)  # a second delivery would run within this
    assert tasks.runs[result.id] == 2  # the deferring run, then the deferred one, once


def refusing_queue(name: str, limit: int | None) -> None:
    """(Re)declare queue `name` in the vhost: one that refuses every publish (``x-overflow =
    reject-publish`` at length 0: the broker nacks it), or an ordinary one."""
    arguments = {"x-max-length": 0, "x-overflow": "reject-publish"} if limit == 0 else None
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        Queue(name, routing_key=name, channel=channel).delete()
        Queue(name, routing_key=name, queue_arguments=arguments, channel=channel).declare()


def test_a_release_the_broker_refuses_keeps_the_parked_task(
    configured: Configure, rabbitmq_vhost: str
) -> None:
    runtime = configured(claim_lease_s=1.0)
    target = f"refusing-{uuid.uuid4().hex[:8]}"
    refusing_queue(target, limit=0)
    message = capture_message(tasks.answer.s())
    message.update(exchange="", routing_key=target)  # the default exchange: straight to it
    lot = ParkingLot(runtime.redis, runtime.keys, lot_name(app))
    runtime.run(lot.park("refused-entry", 0.0, message, 600.0))
    releaser = Releaser(app, lot, runtime.config.deferral)
    with pytest.raises(MessageNacked):  # the publish waits for the broker, which nacks it
        runtime.run(releaser.release_due())
    assert runtime.run(lot.size()) == 1  # still parked
    # Without publisher confirms the same publish "succeeds", and the message is gone.
    plain = Celery("polygate_rabbitmq_unconfirmed", broker=rabbitmq_vhost)
    publish_message(plain, message)
    plain.close()
    refusing_queue(target, limit=None)  # the broker takes messages again

    def released_once() -> bool:  # 0 until the refused release's claim lapses (1 s)
        return bool(runtime.run(releaser.release_due()) == 1)

    # Due again after the 1 s lease: the refused release did not confirm it (a confirmed
    # entry waits release_check_s, 300 s, for its run to begin).
    until(released_once, within_s=60)
    with app.connection_for_write() as connection:
        queue = Queue(target, routing_key=target, channel=connection.default_channel)
        got = queue.get(no_ack=True)
        assert got is not None
        assert got.headers["id"] == message["headers"]["id"]  # the parked task, published once
        assert queue.get(no_ack=True) is None  # the nacked publishes were not enqueued
        queue.delete()
