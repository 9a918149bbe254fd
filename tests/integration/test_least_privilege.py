"""Least privilege: the package works as a Redis ACL user confined to its own keys.

The user may touch only the governance prefix, the broker's and result
backend's keys and their channels, and no administrative or dangerous command
(``CONFIG``, ``KEYS``, ``FLUSHALL``, ...); the default user needs a password.
Against it run the whole store contract and one Celery outcome per row of the
outcome table: success, deferral then success, retry budget spent, fatal.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as sync_redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from polygate_celery import AllSourcesExhausted, SourceFatalError
from polygate_celery.celery import configure_worker
from polygate_celery.celery.runtime import reset_runtime, runtime_for
from polygate_celery.store.redis import RedisStore
from polygate_celery.testing import VirtualClock
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.outcome_rows import outcome_config, outcome_models, outcome_tasks
from tests.conftest import drop_result_subscriptions
from tests.redis_server import RedisServer
from tests.unit.store import (
    test_store_contract_gate,
    test_store_contract_operator,
    test_store_contract_permits,
    test_store_contract_state,
)
from tests.unit.store.conftest import Harness

ADMIN_PASSWORD = "acl-admin-pw-2b7e"
USER, PASSWORD = "polygate", "acl-user-pw-9d41"
PREFIX = "pgacl"
QUEUE = "pgacl-tasks"
GRANTS = [
    "resetkeys",
    f"~{{{PREFIX}}}*",  # the governance store and the parking lot: {pgacl}:v1:...
    f"~{QUEUE}*",  # the queue (and kombu's priority variants of its name)
    "~_kombu.*",  # exchange bindings
    "~unacked*",  # unacknowledged messages, their index and mutex
    "~celery-task-meta-*",  # the result backend
    "~*.celery.pidbox*",  # each worker's remote-control queue (and the reply queue)
    # Channels are not keys: kombu's fanout subscribes by pattern (PSUBSCRIBE), which an
    # ACL only allows for literally listed patterns, so the user keeps every channel.
    "allchannels",
    "-@all",
    "+@read",
    "+@write",
    "+@keyspace",
    "+@list",
    "+@hash",
    "+@set",
    "+@sortedset",
    "+@string",
    "+@pubsub",
    "+@transaction",
    "+@scripting",
    "+@connection",
    "-@dangerous",
    "-@admin",
    "+time",
]


@pytest.fixture(scope="module")
def acl_url() -> Iterator[str]:
    """A private Redis: the default user locked by a password, `USER` confined by ACL."""
    with RedisServer() as server:
        admin = sync_redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "SETUSER", USER, "on", f">{PASSWORD}", *GRANTS)
        admin.config_set("requirepass", ADMIN_PASSWORD)
        yield f"redis://{USER}:{PASSWORD}@127.0.0.1:{server.port}/0"


def test_the_user_is_really_confined(acl_url: str) -> None:
    client = sync_redis.Redis.from_url(acl_url)
    with pytest.raises(sync_redis.exceptions.NoPermissionError):
        client.set("someone-elses-key", "x")
    with pytest.raises(sync_redis.exceptions.NoPermissionError):
        client.config_get("maxmemory-policy")
    with pytest.raises(sync_redis.exceptions.NoPermissionError):
        client.flushall()


def contract_tests() -> list[Callable[[Harness], Any]]:
    """Every store contract test that needs nothing but a harness."""
    modules = [
        test_store_contract_gate,
        test_store_contract_operator,
        test_store_contract_permits,
        test_store_contract_state,
    ]
    found = []
    for module in modules:
        for name, function in vars(module).items():
            if (
                name.startswith("test_")
                and inspect.iscoroutinefunction(function)
                and list(inspect.signature(function).parameters) == ["h"]
            ):
                found.append(function)
    return found


CONTRACT = contract_tests()


@pytest.mark.parametrize("contract_test", CONTRACT, ids=lambda f: f.__name__)
async def test_the_store_contract_holds_for_the_confined_user(
    acl_url: str, contract_test: Callable[[Harness], Any]
) -> None:
    clock = VirtualClock()
    store = RedisStore.from_url(acl_url, prefix=PREFIX, clock=clock)
    try:
        await contract_test(Harness(store, clock))
    finally:
        keys = [k async for k in store.client.scan_iter(match=store.keys.pattern)]
        if keys:
            await store.client.delete(*keys)
        await store.aclose()


def test_the_contract_subset_is_most_of_the_contract() -> None:
    assert len(CONTRACT) >= 60


# -- one Celery outcome per row ------------------------------------------------------------------

app = Celery("polygate_acl")
tasks = outcome_tasks(app)


def test_one_celery_outcome_per_row_as_the_confined_user(acl_url: str) -> None:
    with SimulatedProvider(outcome_models()) as provider:
        config = outcome_config(acl_url, PREFIX, provider.url)
        app.conf.update(broker_url=acl_url, result_backend=acl_url, task_default_queue=QUEUE)
        configure_worker(app, config, extra_task_s=20)
        reset_runtime(app)
        try:
            with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
                runtime = runtime_for(app)
                assert tasks.answer.delay().get(timeout=30) == "fine"
                runtime.run(runtime.store.pause_source("main", 1.0))
                deferred = tasks.answer.delay(fail_fast=True)
                assert deferred.get(timeout=30) == "fine"
                assert tasks.runs[deferred.id] == 2
                with pytest.raises(AllSourcesExhausted, match="retry_exhausted"):
                    tasks.answer_down.delay().get(timeout=30)
                with pytest.raises(SourceFatalError, match="malformed"):
                    tasks.refuse.delay().get(timeout=30)
                app.backend.result_consumer.cancel_for(deferred.id)
        finally:
            reset_runtime(app)  # its background threads first: they could still send
            drop_result_subscriptions(app)  # before the module's Redis goes away
            asyncio.set_event_loop(None)
