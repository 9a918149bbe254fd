"""Redis faults during a governed Celery run: frozen for 10 s, then killed and restarted.

One private Redis (AOF, ``appendfsync always``) is broker, result backend and
governance store for a real ``celery worker``. While the run is under way Redis
is frozen (SIGSTOP) for 10 s, and later killed (SIGKILL) and restarted on the
same data. Afterwards the tasks sent are exactly those completed plus those
failed with a reason; no request reached the provider while Redis was frozen or
down (no lease could be granted or renewed), and the provider never saw more
requests at once than the cap.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
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
QUICK = {"POLYGATE_TEST_EXTRA_TASK_S": "1", "POLYGATE_TEST_VISIBILITY_MARGIN_S": "1"}


def done(results: list[AsyncResult]) -> int:
    return sum(1 for r in results if r.state in ("SUCCESS", "FAILURE"))


def wait_for(condition: Any, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.skipif(not soak.SOAK, reason="soak tier (make soak): about 3 minutes")
def test_a_frozen_then_killed_redis_loses_no_task(tmp_path: Path, figures: Figures) -> None:
    models = {"up": ModelBehaviour(reply="fine", latency_s=(0.02, 0.08))}
    with RedisServer(persistent=True) as redis, SimulatedProvider(models) as provider:
        url = redis.url
        data = config_data(provider, url, f"faults-{uuid.uuid4().hex[:8]}")
        data["store"]["lease_s"] = 3
        data["sources"]["main"]["max_concurrency"] = CAP
        data["deferral"] |= {"max_deferrals": 50}
        for scope in data["scopes"].values():
            scope["max_call_s"] = 2  # with QUICK: a lost worker's task is back within ~34 s
        # A client of its own: the shared test app's producer pool stays on the first broker
        # it used, which in a whole run is the shared test Redis, not this one.
        client = Celery("faults_client", broker=url, backend=url)
        client.conf.task_default_queue = "polygate-tests"
        with celery_worker(data, url, tmp_path, pool="threads", concurrency=8, settings=QUICK):
            results = [client.send_task(ask_quietly.name, args=[f"task {i}"]) for i in range(TASKS)]
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

            wait_for(lambda: done(results) == TASKS, 300, "tasks left unfinished")
            states = Counter(r.state for r in results)
            reasons = Counter(type(r.result).__name__ for r in results if r.state == "FAILURE")
            sent = {r.id for r in results}
            finished = {r.id for r in results if r.state in ("SUCCESS", "FAILURE")}
        drop_result_subscriptions(client)  # while this Redis still answers
        journal = provider.journal
    assert finished == sent
    assert set(reasons) <= {"AllSourcesExhausted", "DeferralBudgetExceeded"}, reasons
    outages = [(frozen_at, thawed_at), (down_at, up_at)]
    during = [e for e in journal if any(a + 0.05 < e.at < b for a, b in outages)]
    assert during == []  # nothing went out while no lease could be granted or renewed
    assert provider.peak("up") <= CAP
    figures(
        f"{TASKS} tasks, Redis frozen 10 s then killed and restarted (AOF): {dict(states)}"
        f"{'; failures ' + str(dict(reasons)) if reasons else ''}; 0 requests while Redis was "
        f"frozen or down; provider peak {provider.peak('up')} (cap {CAP})"
    )
