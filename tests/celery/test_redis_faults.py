"""Redis faults during a governed Celery run: frozen for 10 s, then killed and restarted.

One private Redis (AOF, ``appendfsync always``) is broker, result backend and
governance store for a real ``celery worker``. While the run is under way Redis
is frozen (SIGSTOP) for 10 s, and later killed (SIGKILL) and restarted on the
same data. The provider is up throughout, so every task must succeed, with the
default deferral budget: a task that failed is as good as lost here. No request
reached the provider while Redis was frozen or down (no lease could be granted
or renewed), and the provider never saw more requests at once than the cap.

A fault can also lose a message before any task code runs: kombu's Redis transport
pops it (BRPOP) before it records it as unacknowledged, and a pop whose reply the
fault cuts off is gone (README). Such a task is told apart, and reported with its id,
only on evidence: it stayed PENDING, the worker's `task_received` never saw its id
(recorded in a Redis of the test's own that no fault touches), and the broker holds
nothing queued or unacknowledged. The worker has one consumer connection, so each of
the two faults can cut off at most one pop.
``make soak`` runs it (1,000 tasks): it takes minutes, more on a busy machine.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from celery import Celery
from celery.result import AsyncResult

from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests import soak
from tests.celery.app import ask_quietly
from tests.celery.conftest import config_data
from tests.celery.workers import celery_worker
from tests.conftest import Figures, drop_result_subscriptions
from tests.redis_server import RedisServer

TASKS = 1_000
CAP = 4
QUEUE = "polygate-tests"
QUIET_S = 30.0  # nothing left but tasks never received, for this long: they are lost
QUICK = {"POLYGATE_TEST_EXTRA_TASK_S": "1", "POLYGATE_TEST_VISIBILITY_MARGIN_S": "1"}


def done(results: list[AsyncResult]) -> int:
    """Tasks with a final state (a failure counts here, so that the wait ends; it fails the
    test afterwards)."""
    return sum(1 for r in results if r.state in ("SUCCESS", "FAILURE"))


def unfinished(results: list[AsyncResult]) -> str:
    """The tasks without a final state: how many in each state, and the first ids."""
    left = [r for r in results if r.state not in ("SUCCESS", "FAILURE")]
    ids = ", ".join(r.id for r in left[:10])
    return f"{len(left)} ({dict(Counter(r.state for r in left))}; first: {ids})"


def never_received(results: list[AsyncResult], witness: sync_redis.Redis) -> list[str]:
    """PENDING tasks whose id no worker's `task_received` saw."""
    seen = {m.decode() for m in witness.smembers("received")}
    return [r.id for r in results if r.id not in seen and r.state == "PENDING"]


def broker_empty(url: str) -> bool:
    """Nothing queued, unacknowledged or waiting as ETA in the broker (the parking lot
    holds only messages whose run began, which were received)."""
    try:
        with sync_redis.Redis.from_url(url) as client:
            return client.llen(QUEUE) == 0 and client.hlen("unacked") == 0
    except sync_redis.RedisError:
        return False


def wait_for(condition: Any, within_s: float, what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(what() if callable(what) else what)
        time.sleep(0.2)


@pytest.mark.skipif(not soak.SOAK, reason="soak tier (make soak): minutes on a busy machine")
@pytest.mark.timeout(1800)
def test_a_frozen_then_killed_redis_loses_no_task(tmp_path: Path, figures: Figures) -> None:
    models = {"up": ModelBehaviour(reply="fine", latency_s=(0.02, 0.08))}
    with (
        RedisServer(persistent=True) as redis,
        RedisServer() as witness_server,
        SimulatedProvider(models) as provider,
    ):
        witness = sync_redis.Redis.from_url(witness_server.url)
        url = redis.url
        data = config_data(provider, url, f"faults-{uuid.uuid4().hex[:8]}")
        data["store"]["lease_s"] = 3
        data["sources"]["main"]["max_concurrency"] = CAP
        for scope in data["scopes"].values():
            scope["max_call_s"] = 2  # with QUICK: a lost worker's task is back within ~34 s
        # A client of its own: the shared test app's producer pool stays on the first broker
        # it used, which in a whole run is the shared test Redis, not this one.
        client = Celery("faults_client", broker=url, backend=url)
        client.conf.task_default_queue = QUEUE
        env = {**QUICK, "POLYGATE_TEST_RECEIVED": witness_server.url}
        try:
            with celery_worker(data, url, tmp_path, pool="threads", concurrency=8, settings=env):
                results = [
                    client.send_task(ask_quietly.name, args=[f"task {i}"]) for i in range(TASKS)
                ]
                wait_for(lambda: done(results) >= TASKS // 4, 120, "the run did not start")

                frozen_at = provider.since_start()
                redis.pause()
                time.sleep(10)
                redis.resume()
                thawed_at = provider.since_start()

                wait_for(lambda: done(results) >= TASKS // 2, 180, "no progress after the freeze")
                redis.kill()
                down_at = provider.since_start()
                time.sleep(2)
                redis.start()
                up_at = provider.since_start()

                quiet_since: list[float] = []

                def finished() -> bool:
                    if done(results) == TASKS:
                        return True
                    lost = never_received(results, witness)
                    if done(results) + len(lost) < TASKS or not broker_empty(url):
                        quiet_since.clear()
                        return False
                    quiet_since[:] = quiet_since or [time.monotonic()]
                    return time.monotonic() - quiet_since[0] > QUIET_S

                wait_for(finished, 300, lambda: f"tasks left unfinished: {unfinished(results)}")
                lost = never_received(results, witness)
                states = Counter(r.state for r in results if r.id not in lost)
                failures = {r.id: repr(r.result) for r in results if r.state == "FAILURE"}
        finally:
            # while this Redis still answers, pass or fail: a subscription left behind is
            # dropped by a later test's garbage collection, against a server gone by then
            drop_result_subscriptions(client)
        journal = provider.journal
    assert states == {"SUCCESS": TASKS - len(lost)}, failures
    assert len(lost) <= 2, f"never read from the broker: {lost}"
    outages = [(frozen_at, thawed_at), (down_at, up_at)]
    during = [e for e in journal if any(a + 0.05 < e.at < b for a, b in outages)]
    assert during == []  # nothing went out while no lease could be granted or renewed
    assert provider.peak("up") <= CAP
    figures(
        f"{TASKS} tasks, Redis frozen 10 s then killed and restarted (AOF): "
        + (
            f"all succeeded but {len(lost)} never read from the broker (kombu's BRPOP cut "
            f"off: {', '.join(lost)}), "
            if lost
            else "all succeeded, "
        )
        + f"default deferral budget; 0 requests while Redis was frozen or down; provider peak "
        f"{provider.peak('up')} (cap {CAP})"
    )
