"""Secrets stay secret through real Celery runs, and only JSON messages are accepted.

A private Redis with a password serves as broker, result backend and store; the
simulated provider demands a canary API key. After successful, failing, fatal
and deferred runs, neither the key nor the Redis password appears in any log
record (DEBUG, every logger), any result-backend value, any exception's args,
any task's metadata, or any value of any key a SCAN of the server finds.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis as sync_redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from polygate_celery.celery import configure_worker
from polygate_celery.celery.runtime import reset_runtime, runtime_for
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import ask
from tests.celery.outcome_rows import outcome_config, outcome_models, outcome_tasks
from tests.conftest import CANARY_KEY, drop_result_subscriptions
from tests.redis_server import RedisServer

PASSWORD = "redis-canary-pw-51c0d2e9"
SECRETS = (CANARY_KEY, PASSWORD, CANARY_KEY[3:])


# An app of its own: the shared test app keeps its producer pool on the first broker it used.
app = Celery("polygate_secrets")
tasks = outcome_tasks(app)


@pytest.fixture
def guarded_redis() -> Iterator[str]:
    """A private Redis whose default user needs `PASSWORD`; yields its URL with it."""
    with RedisServer() as server:
        sync_redis.Redis.from_url(server.url).config_set("requirepass", PASSWORD)
        yield f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"


def dump_every_key(url: str) -> list[str]:
    """Every key of the server and its whole value, whatever its type, as text."""
    client = sync_redis.Redis.from_url(url)
    seen = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        readers: dict[str, Any] = {
            "string": client.get,
            "hash": client.hgetall,
            "list": lambda k: client.lrange(k, 0, -1),
            "set": client.smembers,
            "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
            "stream": client.xrange,
        }
        value = readers.get(kind, lambda k: b"")(key)
        seen.append(f"{key!r} {kind} {value!r}")
    return seen


def test_no_secret_reaches_logs_results_errors_metadata_or_any_redis_key(
    guarded_redis: str, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"secrets-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.DEBUG)
    with SimulatedProvider(outcome_models(api_key=CANARY_KEY)) as provider:
        config = outcome_config(guarded_redis, prefix, provider.url, api_key=CANARY_KEY)
        app.conf.update(broker_url=guarded_redis, result_backend=guarded_redis)
        configure_worker(app, config, extra_task_s=20)
        reset_runtime(app)
        try:
            with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
                runtime = runtime_for(app)
                ok = tasks.answer.delay()
                failed = tasks.answer_down.delay()
                refused = tasks.refuse.delay()
                runtime.run(runtime.store.pause_source("main", 1.0))
                deferred = tasks.answer.delay(fail_fast=True)
                assert ok.get(timeout=30) == "fine"
                assert deferred.get(timeout=30) == "fine"
                results = [ok, failed, refused, deferred]
                texts: list[str] = []
                for result in (failed, refused):
                    with pytest.raises(Exception) as caught:  # noqa: PT011 - any verdict
                        result.get(timeout=30)
                    exception = caught.value
                    assert "retry_exhausted" in str(exception) or "malformed" in str(exception)
                    texts += [repr(exception), str(exception), repr(exception.args)]
                    texts.append(repr(result.traceback))
                assert all(provider.journal[i].authorized for i in range(len(provider.journal)))
                metas = [repr(app.backend.get_task_meta(r.id)) for r in results]
                for result in results:  # unsubscribe while this Redis still answers
                    app.backend.result_consumer.cancel_for(result.id)
        finally:
            reset_runtime(app)  # its background threads first: they could still send
            drop_result_subscriptions(app)
    texts += metas
    texts += [record.getMessage() for record in caplog.records]
    texts += [repr(record.args) + repr(record.exc_info) for record in caplog.records]
    texts += dump_every_key(guarded_redis)
    leaks = [text for text in texts if any(secret in text for secret in SECRETS)]
    assert leaks == []
    assert len(texts) > 20  # the search had something to read
    assert tasks.runs[deferred.id] == 2  # the deferred task did defer, then ran again


def test_a_pickled_message_is_refused_and_never_runs(
    governed_worker: Any, broker: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with governed_worker():
        pickled = ask.apply_async(("pickled",), serializer="pickle")
        assert ask.delay("json").get(timeout=20) == "fine"  # the worker is up and serving
        seen = ""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "untrusted" not in seen:
            seen += capfd.readouterr().err
            time.sleep(0.05)
    assert "Refusing to deserialize untrusted content of type pickle" in seen
    assert pickled.state == "PENDING"  # never ran, no result
    client = sync_redis.Redis.from_url(broker)
    assert client.llen(f"runs:{pickled.id}") == 0
