"""What a real ``celery worker`` says as it starts: the checks run at worker start."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from polygate_celery.celery import DEFERRED
from polygate_celery.store.redis import RedisStore
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import ask_quietly
from tests.celery.conftest import config_data
from tests.celery.workers import celery_worker
from tests.conftest import drop_result_subscriptions
from tests.redis_server import RedisServer


@pytest.mark.parametrize(("policy", "warns"), [("allkeys-lru", True), ("noeviction", False)])
def test_a_worker_warns_at_start_when_redis_could_evict_governance_keys(
    provider: SimulatedProvider,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    policy: str,
    warns: bool,
) -> None:
    with RedisServer() as server:
        redis.Redis.from_url(server.url).config_set("maxmemory-policy", policy)
        data = config_data(provider, server.url, f"start-{uuid.uuid4().hex[:8]}")
        client = Celery("start_client", broker=server.url, backend=server.url)
        client.conf.task_default_queue = "polygate-tests"
        with celery_worker(data, server.url, tmp_path, pool="threads", concurrency=1):
            # the task runs once the worker is ready, after its start-up checks
            assert client.send_task(ask_quietly.name, args=["hi"]).get(timeout=60) == "fine"
        drop_result_subscriptions(client)
    logged = capfd.readouterr().err
    assert (f"Redis maxmemory-policy is '{policy}'" in logged) is warns, logged[-2000:]


@pytest.mark.parametrize("strategy", ["park", "countdown"])
def test_a_routed_task_deferred_comes_back_to_its_own_queue(
    provider: SimulatedProvider, tmp_path: Path, strategy: str
) -> None:
    """Routed to a queue the default-queue worker does not read: the deferred message must
    return there (the worker reads only that queue), keeping its task id."""
    with RedisServer() as server:
        prefix = f"routed-{uuid.uuid4().hex[:8]}"
        data = config_data(provider, server.url, prefix)
        data["deferral"]["strategy"] = strategy
        client = Celery("routed_client", broker=server.url, backend=server.url)
        client.conf.task_default_queue = "polygate-tests"
        client.conf.task_routes = {ask_quietly.name: {"queue": "polygate-routed"}}
        with celery_worker(data, server.url, tmp_path, pool="threads", queues="polygate-routed"):
            warm_up = client.send_task(ask_quietly.name, args=["warm up"])
            assert warm_up.get(timeout=60) == "fine"  # the worker is up before the pause
            store = RedisStore.from_url(server.url, prefix=prefix)
            asyncio.run(_pause(store, "main", 3.0))  # past the 1 s stall window: it defers
            result = client.send_task(ask_quietly.name, args=["routed"])
            deferred = deferral_of(result)
            assert result.get(timeout=60) == "fine"
        assert redis.Redis.from_url(server.url).llen("polygate-tests") == 0
        drop_result_subscriptions(client)
    assert (deferred["reason"], deferred["strategy"]) == ("stalled", strategy)


def deferral_of(result: AsyncResult, within_s: float = 30) -> dict[str, object]:
    """The task's DEFERRED state, once it shows."""
    deadline = time.monotonic() + within_s
    while result.state != DEFERRED:
        assert time.monotonic() < deadline, f"never deferred (is {result.state})"
        time.sleep(0.02)
    return dict(result.info)


async def _pause(store: RedisStore, source: str, seconds: float) -> None:
    try:
        await store.pause_source(source, seconds)
    finally:
        await store.aclose()
