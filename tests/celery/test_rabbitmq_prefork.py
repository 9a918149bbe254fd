"""`celery worker` processes on RabbitMQ, with the prefork pool: a parked task released by a
pool process's release loop (publisher confirms), and a killed pool process's task
delivered again. The broker is a vhost of the session's own (`tests.celery.rabbitmq`);
store and results are the test Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis as sync_redis

from polygate_celery.celery import DEFERRED
from polygate_celery.store.redis import RedisStore
from polygate_celery.testing.simulator import SimulatedProvider
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
from tests.celery.rabbitmq_app import QUEUE, app, ask_in
from tests.celery.workers import ROOT, toml
from tests.conftest import drop_result_subscriptions, own_redis


def until(condition: Callable[[], bool], within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def results() -> Iterator[str]:
    """A private Redis for the module's results (its app keeps the first backend it made)."""
    with own_redis() as url:
        yield url
        drop_result_subscriptions(app)


class PreforkWorker:
    """Starts a prefork `celery worker` of `rabbitmq_app` on the vhost; pauses sources in
    its store."""

    def __init__(self, broker: str, results: str, redis_url: str, prefix: str) -> None:
        self.broker, self.results, self.redis_url, self.prefix = broker, results, redis_url, prefix

    @contextmanager
    def start(self, config: Path, concurrency: int = 2) -> Iterator[subprocess.Popen[bytes]]:
        env = {
            **os.environ,
            "POLYGATE_CONFIG": str(config),
            "POLYGATE_RABBITMQ_BROKER": self.broker,
            "POLYGATE_RABBITMQ_RESULTS": self.results,
        }
        command = [sys.executable, "-m", "celery", "-A", "tests.celery.rabbitmq_app", "worker"]
        command += ["-P", "prefork", "-c", str(concurrency), "-Q", QUEUE, "--loglevel", "WARNING"]
        command += ["--without-heartbeat", "--without-mingle", "--without-gossip"]
        process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
        try:
            yield process
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)

    def pause(self, source: str, seconds: float) -> None:
        async def pause() -> None:
            store = RedisStore.from_url(self.redis_url, prefix=self.prefix)
            try:
                await store.pause_source(source, seconds)
            finally:
                await store.aclose()

        asyncio.run(pause())

    def runs(self, task_id: str) -> list[int]:
        """The process of each run of `task_id` so far."""
        client = sync_redis.Redis.from_url(self.results)
        return [int(pid) for pid in client.lrange(f"runs:{task_id}", 0, -1)]


@pytest.fixture
def worker(
    rabbitmq_vhost: str,
    results: str,
    redis_url: str,
    provider: SimulatedProvider,
    tmp_path: Path,
) -> Iterator[tuple[PreforkWorker, Path]]:
    """The worker starter and its configuration file (a store prefix of the test's own)."""
    prefix = f"rabbitmq-prefork-{uuid.uuid4().hex[:8]}"
    app.conf.update(broker_url=rabbitmq_vhost, result_backend=results)
    data = config_data(provider, redis_url, prefix, extra_sources={"killable": "killable"})
    data["store"]["lease_s"] = 2.0
    path = tmp_path / f"{prefix}.toml"
    path.write_text(toml(data))
    yield PreforkWorker(rabbitmq_vhost, results, redis_url, prefix), path
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)


def test_a_pool_process_releases_a_parked_task(worker: tuple[PreforkWorker, Path]) -> None:
    starter, config = worker
    with starter.start(config):
        assert ask_in.delay("chat").get(timeout=90) == "fine"  # the pool is up
        starter.pause("main", 1.0)
        result = ask_in.delay("chat", fail_fast=True)
        until(lambda: result.state == DEFERRED)
        assert (result.info["reason"], result.info["strategy"]) == ("fail_fast", "park")
        assert result.get(timeout=60) == "fine"  # released by a pool process's loop
        time.sleep(2.0)  # a second delivery would run within this
    runs = starter.runs(result.id)
    assert len(runs) == 2  # the deferring run, then the released one, once


def test_a_killed_pool_process_is_delivered_again(
    worker: tuple[PreforkWorker, Path], provider: SimulatedProvider
) -> None:
    starter, config = worker
    with starter.start(config):
        assert ask_in.delay("chat").get(timeout=90) == "fine"  # the pool is up
        result = ask_in.delay("killable")
        until(lambda: len(starter.runs(result.id)) == 1)
        until(lambda: provider.in_flight("killable") == 1)  # mid-call, its permit held
        os.kill(starter.runs(result.id)[0], signal.SIGKILL)
        assert result.get(timeout=120) == "survived"  # delivered again by RabbitMQ
    runs = starter.runs(result.id)
    assert len(runs) == 2  # the killed run, then the redelivered one, once
    assert runs[0] != runs[1]


def test_a_foreign_producers_tasks_run_once_after_their_deferrals(
    rabbitmq_vhost: str,
    results: str,
    redis_url: str,
    provider: SimulatedProvider,
    tmp_path: Path,
) -> None:
    """`test_foreign_producer.py`'s test on RabbitMQ: tasks sent by a process that never
    imported the package leave no parked entry behind and never run again."""
    prefix = f"foreign-mq-{uuid.uuid4().hex[:8]}"
    app.conf.update(broker_url=rabbitmq_vhost, result_backend=results)
    path = tmp_path / f"{prefix}.toml"
    path.write_text(toml(config_data(provider, redis_url, prefix, deferral=DEFERRAL)))
    starter = PreforkWorker(rabbitmq_vhost, results, redis_url, prefix)
    try:
        with starter.start(path):
            assert ask_in.delay("chat").get(timeout=90) == "fine"  # the pool is up
            pause(redis_url, prefix, "main", PAUSE_S)
            ids = send_by_name(rabbitmq_vhost, results, QUEUE, ask_in.name, ["chat", True])
            assert [app.AsyncResult(i).get(timeout=90) for i in ids] == ["fine"] * TASKS
            leaves_nothing_behind(ids, lambda i: len(starter.runs(i)), redis_url, prefix)
    finally:
        forget(redis_url, prefix)
