"""Corrupt entries in a real worker's parking lot (a body of "x", an unknown serializer or
compression, an exchange of the wrong type or none, not JSON): the worker stays alive,
each goes to the dead letters, and every good task parked beside them runs to SUCCESS."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis

from polygate_celery.celery.parking import ParkingLot, capture_message, lot_name
from polygate_celery.store.redis import redis_client
from polygate_celery.store.redis.keys import KeySpace
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import app, ask
from tests.celery.conftest import config_data
from tests.celery.workers import celery_worker


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    prefix = f"crafted-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)


def park(redis_url: str, prefix: str, entries: dict[str, dict[str, Any] | str]) -> None:
    """Park `entries` (id -> message, or a text stored as it is), due now, in order, in
    the worker's lot."""

    async def parked() -> None:
        client = redis_client(redis_url)
        lot = ParkingLot(client, KeySpace(prefix=prefix), lot_name(app))
        for entry, message in entries.items():
            await lot.park(entry, 0.0, message if isinstance(message, dict) else {}, 60.0)
            if isinstance(message, str):
                await client.hset(lot.keys[1], entry, message)
        await client.aclose()

    asyncio.run(parked())


def test_a_worker_with_corrupt_entries_in_its_lot_stays_alive_and_runs_the_rest(
    provider: SimulatedProvider, redis_url: str, broker: str, prefix: str, tmp_path: Path
) -> None:
    app.conf.update(broker_url=broker, result_backend=broker, task_default_queue="polygate-tests")
    crafted: dict[str, dict[str, Any] | str] = {
        "corrupt": {"body": "x"},  # the right keys, not Celery's [args, kwargs, embed]
        "serializer": {"serializer": "bogus"},
        "compression": {"compression": "bogus"},
        "exchange type": {"exchange": {"name": ""}},
        "no exchange": {"exchange": "polygate-no-such-exchange"},
    }
    for case, fields in crafted.items():
        crafted[case] = {**capture_message(ask.s(case)), **dict(fields)}
    crafted["not JSON"] = json.dumps(capture_message(ask.s("not JSON")))[:-7]
    goods = {f"good-{n}": capture_message(ask.s(f"n{n}")) for n in range(4)}
    park(redis_url, prefix, {**crafted, **goods})
    with celery_worker(config_data(provider, redis_url, prefix), broker, tmp_path) as worker:
        ids = [message["headers"]["id"] for message in goods.values()]
        results = [app.AsyncResult(task_id) for task_id in ids]
        assert [r.get(timeout=90) for r in results] == ["fine"] * 4
        assert all(r.state == "SUCCESS" for r in results)
        time.sleep(1.0)  # a worker that took the corrupt message would be gone by now
        assert worker.poll() is None, "the worker died"
        parked = KeySpace(prefix=prefix).parked(lot_name(app))
        client = sync_redis.Redis.from_url(redis_url)
        assert sorted(client.hgetall(f"{parked}:dead")) == sorted(c.encode() for c in crafted)
        assert not any(client.zscore(parked, case) for case in crafted)
