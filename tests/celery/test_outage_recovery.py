"""An outage at the package defaults on a real prefork worker (SPEC §3 rule 16).

The provider refuses connections for `OUTAGE_S`, then serves. No run holds its
worker slot more than 75 s before it parks; every parked task runs again within
one probe interval (15 s at most) and one release interval of the recovery, plus a
margin for a busy machine; all succeed, none is lost or runs twice, and the provider
answers no 429 after recovery. Scaled in CI; full size (200 tasks, 5 minutes) under
``make soak``.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis as sync_redis

from polygate_celery.config.models import DeferralConfig
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.celery.app import app, timed
from tests.celery.test_outage_run import free_port
from tests.celery.workers import celery_worker
from tests.conftest import Figures
from tests.soak import size

TASKS = size(ci=20, soak=200)
OUTAGE_S = float(size(ci=90, soak=300))
CONCURRENCY = size(ci=8, soak=16)
SLOT_HOLD_LIMIT_S = 75.0
PROBE_INTERVAL_S = 15.0  # at most, by default (SPEC §5)
RELEASE_INTERVAL_S = DeferralConfig().release_interval_s
BUSY_MACHINE_S = 10.0  # a worker process's start of a published task on a loaded machine


@pytest.mark.timeout(OUTAGE_S + 600)
def test_an_outage_parks_within_a_minute_and_resumes_on_recovery(
    broker: str, redis_url: str, tmp_path: Path, figures: Figures, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.conf.update(broker_url=broker, result_backend=broker, task_default_queue="polygate-tests")
    # A message carries its sender's time limits: those an in-process worker of an earlier
    # test set on this process's task object would override the worker's own.
    monkeypatch.setattr(timed, "soft_time_limit", None)
    monkeypatch.setattr(timed, "time_limit", None)
    port = free_port()
    prefix = f"recovery-{uuid.uuid4().hex[:10]}"
    config = {  # the package defaults, but where the store and the provider are
        "store": {"redis_url": redis_url, "key_prefix": prefix},
        "sources": {"main": {"base_url": f"http://127.0.0.1:{port}/v1", "model": "up"}},
        "scopes": {"chat": {"kind": "chat", "sources": ["main"]}},
    }
    client = sync_redis.Redis.from_url(broker)
    try:
        with celery_worker(config, broker, tmp_path, pool="prefork", concurrency=CONCURRENCY):
            results = [timed.delay(f"task {i}") for i in range(TASKS)]
            time.sleep(OUTAGE_S)  # nothing listens: every connection is refused
            with SimulatedProvider({"up": ModelBehaviour(reply="fine")}, port=port) as provider:
                recovered = time.monotonic()
                outcomes = [r.get(timeout=OUTAGE_S + 300, propagate=False) for r in results]
                states = Counter(r.state for r in results)
                answered = Counter(e.status for e in provider.journal)
    finally:
        store = sync_redis.Redis.from_url(redis_url)
        for key in store.scan_iter(match=f"{{{prefix}}}*"):
            store.delete(key)
    runs = {
        r.id: [
            tuple(float(x) for x in raw.split()) for raw in client.lrange(f"timed:{r.id}", 0, -1)
        ]
        for r in results
    }
    holds = [ended - began for task in runs.values() for _, began, ended in task]
    # A task parked before the recovery: when its first run after the recovery began.
    resumed = []
    for task in runs.values():
        after = [i for i, (_, began, _) in enumerate(task) if began >= recovered]
        if after and after[0] > 0 and task[after[0] - 1][2] < recovered:
            resumed.append(task[after[0]][1] - recovered)
    deferrals = Counter(len(task) - 1 for task in runs.values())
    figures(
        f"{TASKS} tasks, refused for {OUTAGE_S:.0f} s, package defaults, prefork x{CONCURRENCY}: "
        f"{dict(states)}; longest slot hold {max(holds):.1f} s; parked tasks resumed "
        f"{min(resumed, default=0):.1f}-{max(resumed, default=0):.1f} s after recovery; "
        f"tasks by deferral count {dict(sorted(deferrals.items()))}; provider answers "
        f"{dict(answered)}"
    )
    assert states == {"SUCCESS": TASKS}, [o for o in outcomes if o != "fine"][:3]
    assert outcomes == ["fine"] * TASKS
    for task_id, task in runs.items():  # each run once, numbered 0, 1, ..., n: none twice
        assert [int(n) for n, _, _ in task] == list(range(len(task))), (task_id, task)
    assert max(holds) <= SLOT_HOLD_LIMIT_S
    assert resumed, "no task was parked through the outage"
    assert max(resumed) <= PROBE_INTERVAL_S + RELEASE_INTERVAL_S + BUSY_MACHINE_S
    assert answered[429] == 0
