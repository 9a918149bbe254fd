"""What a real ``celery worker`` says as it starts: the checks run at worker start."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery

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
