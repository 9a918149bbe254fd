"""Tasks sent by a producer that never imported the package (``send_task`` by name from a
web app or another team's service): deferred, parked and released like any other, their
parked entries gone once their runs begin, and their bodies never run again after the
final outcome, also after every marker's TTL has ended. Real prefork workers, on Redis
and on RabbitMQ."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as sync_redis

from polygate_celery.store.redis import RedisStore
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery import rabbitmq_app
from tests.celery.app import app, ask
from tests.celery.conftest import config_data
from tests.celery.test_rabbitmq_prefork import PreforkWorker
from tests.celery.workers import celery_worker, toml
from tests.conftest import drop_result_subscriptions, own_redis

PRODUCER = """
import json, sys
from celery import Celery

broker, backend, queue, name, count, args = sys.argv[1:]
app = Celery("foreign", broker=broker, backend=backend)
ids = [app.send_task(name, args=json.loads(args), queue=queue).id for _ in range(int(count))]
assert not [m for m in sys.modules if m.startswith("polygate")], "the producer imported it"
print(json.dumps(ids))
"""

TASKS = 12
PAUSE_S = 3.0  # longer than the 1 s stall window: every task defers at least once
# Short marker lifetimes, so that the test sees what defaults would show a day later.
DEFERRAL = {"release_check_s": 1.0, "max_defer_age_s": 10.0}


def send_by_name(broker: str, backend: str, queue: str, name: str, args: list[str]) -> list[str]:
    """Send `TASKS` tasks from a process that imports Celery alone; their ids."""
    command = [sys.executable, "-c", PRODUCER, broker, backend, queue, name, str(TASKS)]
    done = subprocess.run(
        [*command, json.dumps(args)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    ids: list[str] = json.loads(done.stdout)
    return ids


def pause(redis_url: str, prefix: str, source: str, seconds: float) -> None:
    async def pause() -> None:
        store = RedisStore.from_url(redis_url, prefix=prefix)
        try:
            await store.pause_source(source, seconds)
        finally:
            await store.aclose()

    asyncio.run(pause())


def parked(redis_url: str, prefix: str) -> int:
    """Entries in the prefix's parking lots (dead letters apart)."""
    client = sync_redis.Redis.from_url(redis_url)
    lots = list(client.scan_iter(match=f"{{{prefix}}}:*:parked:*", _type="zset"))
    return sum(int(client.zcard(lot)) for lot in lots)


def leaves_nothing_behind(
    ids: list[str], runs: Callable[[str], int], redis_url: str, prefix: str
) -> None:
    """Every task was deferred and succeeded (the caller waited); its entries are gone, and
    no body runs again once the done markers (`max_defer_age_s`) have ended."""
    counted = {task_id: runs(task_id) for task_id in ids}
    assert all(n >= 2 for n in counted.values()), counted  # each deferred, then ran again
    assert parked(redis_url, prefix) == 0  # each entry forgotten as its run began
    # Past the done markers' lifetime and several release checks (1, 2, 4, 8 s ...).
    time.sleep(DEFERRAL["max_defer_age_s"] + 5.0)
    assert {task_id: runs(task_id) for task_id in ids} == counted
    assert parked(redis_url, prefix) == 0


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
            ids = send_by_name(broker, broker, "polygate-tests", ask.name, ["foreign"])
            assert [app.AsyncResult(i).get(timeout=90) for i in ids] == ["fine"] * TASKS
            leaves_nothing_behind(ids, lambda i: int(client.llen(f"runs:{i}")), redis_url, prefix)
    finally:
        drop_result_subscriptions(app)
        forget(redis_url, prefix)


@pytest.fixture
def results() -> Iterator[str]:
    with own_redis() as url:
        yield url
        drop_result_subscriptions(rabbitmq_app.app)


def test_a_foreign_producers_tasks_on_rabbitmq_run_once_after_their_deferrals(
    rabbitmq_vhost: str,
    results: str,
    redis_url: str,
    provider: SimulatedProvider,
    tmp_path: Path,
) -> None:
    prefix = f"foreign-mq-{uuid.uuid4().hex[:8]}"
    rabbitmq_app.app.conf.update(broker_url=rabbitmq_vhost, result_backend=results)
    path = tmp_path / f"{prefix}.toml"
    path.write_text(toml(config_data(provider, redis_url, prefix, deferral=DEFERRAL)))
    starter = PreforkWorker(rabbitmq_vhost, results, redis_url, prefix)
    name, queue = rabbitmq_app.ask_in.name, rabbitmq_app.QUEUE
    try:
        with starter.start(path):
            assert rabbitmq_app.ask_in.delay("chat").get(timeout=90) == "fine"  # the pool is up
            pause(redis_url, prefix, "main", PAUSE_S)
            ids = send_by_name(rabbitmq_vhost, results, queue, name, ["chat"])
            outcomes = [rabbitmq_app.app.AsyncResult(i).get(timeout=90) for i in ids]
            assert outcomes == ["fine"] * TASKS
            leaves_nothing_behind(ids, lambda i: len(starter.runs(i)), redis_url, prefix)
    finally:
        forget(redis_url, prefix)


def forget(redis_url: str, prefix: str) -> None:
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)
