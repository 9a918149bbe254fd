"""Tasks sent by a producer that never imported the package (``send_task`` by name from a
web app or another team's service), on a real prefork worker and a Redis broker:
deferred, parked and released like any other, their parked entries gone once their runs
begin, and their bodies never run again after the final outcome, also after every
marker's TTL has ended. The RabbitMQ twin is in `test_rabbitmq_prefork.py`."""

from __future__ import annotations

import uuid
from pathlib import Path

import redis as sync_redis

from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import app, ask
from tests.celery.conftest import config_data
from tests.celery.foreign import (
    DEFERRAL,
    PAUSE_S,
    TASKS,
    forget,
    leaves_nothing_behind,
    pause,
    send_by_name,
)
from tests.celery.workers import celery_worker
from tests.conftest import drop_result_subscriptions


def test_a_foreign_producers_tasks_on_redis_run_once_after_their_deferrals(
    provider: SimulatedProvider, redis_url: str, broker: str, tmp_path: Path
) -> None:
    prefix = f"foreign-{uuid.uuid4().hex[:8]}"
    data = config_data(provider, redis_url, prefix, deferral=DEFERRAL)
    app.conf.update(broker_url=broker, result_backend=broker, task_default_queue="polygate-tests")
    client = sync_redis.Redis.from_url(broker)
    try:
        with celery_worker(data, broker, tmp_path, pool="prefork", concurrency=2):
            assert ask.delay("warm").get(timeout=90) == "fine"  # the pool is up
            pause(redis_url, prefix, "main", PAUSE_S)
            ids = send_by_name(broker, broker, "polygate-tests", ask.name, ["foreign", True])
            assert [app.AsyncResult(i).get(timeout=90) for i in ids] == ["fine"] * TASKS
            leaves_nothing_behind(ids, lambda i: int(client.llen(f"runs:{i}")), redis_url, prefix)
    finally:
        drop_result_subscriptions(app)
        forget(redis_url, prefix)
