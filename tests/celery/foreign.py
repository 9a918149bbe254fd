"""A producer that never imported the package (``send_task`` by name, Celery alone), and
what the tests of its tasks check afterwards (`test_foreign_producer.py` on Redis,
`test_rabbitmq_prefork.py` on RabbitMQ)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import redis as sync_redis

from polygate_celery.store.redis import RedisStore

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
PAUSE_S = 5.0  # the tasks ask with fail_fast: each one that runs within the pause defers
# Short marker lifetimes, so that a test sees what the defaults would show a day later.
DEFERRAL = {"release_check_s": 1.0, "max_defer_age_s": 15.0}


def send_by_name(broker: str, backend: str, queue: str, name: str, args: list[Any]) -> list[str]:
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
    """The tasks succeeded (the caller waited) and some were deferred first; no entry is
    left in the lot, and no body runs again once the done markers (`max_defer_age_s`)
    have ended."""
    counted = {task_id: runs(task_id) for task_id in ids}
    assert any(n >= 2 for n in counted.values()), counted  # deferred, then ran again
    assert parked(redis_url, prefix) == 0  # each entry forgotten as its run began
    # Past the done markers' lifetime and several release checks (1, 2, 4, 8 s ...).
    time.sleep(DEFERRAL["max_defer_age_s"] + 5.0)
    assert {task_id: runs(task_id) for task_id in ids} == counted
    assert parked(redis_url, prefix) == 0


def forget(redis_url: str, prefix: str) -> None:
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)
