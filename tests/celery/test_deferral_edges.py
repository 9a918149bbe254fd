"""Edges of deferral: Celery retries after a deferral, marker failures, store outages, caps."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from polygate_celery.celery.deferral import countdown_cap_s
from polygate_celery.celery.guard import ExecutionGuard
from tests.celery.app import ask, defer_then_retry
from tests.celery.conftest import Worker
from tests.celery.test_outcomes import runs, wait_for_state
from tests.redis_server import RedisServer


def test_a_celery_retry_after_a_deferral_still_runs(governed_worker: Worker, broker: str) -> None:
    with governed_worker():
        result = defer_then_retry.delay()
        assert result.get(timeout=30) == "fine"
    assert runs(broker, result.id) == 3  # deferred, retried, done


def test_a_marker_that_cannot_be_written_never_fails_a_success(
    governed_worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: ExecutionGuard) -> None:
        raise RuntimeError("the store blinked")

    monkeypatch.setattr(ExecutionGuard, "finish", broken)
    with governed_worker():
        result = ask.apply_async(("x",), headers={"polygate_deferrals": 1})  # guard active
        assert result.get(timeout=20) == "fine"


def test_an_unreachable_store_at_the_start_defers_by_countdown(governed_worker: Worker) -> None:
    with (
        RedisServer() as store,
        governed_worker(store={"redis_url": store.url, "lease_s": 10, "socket_timeout_s": 0.5}),
    ):
        store.pause()
        result = ask.apply_async(("x",), headers={"polygate_deferrals": 1})
        meta = wait_for_state(result, "DEFERRED")
        assert (meta["reason"], meta["strategy"]) == ("backend_error", "countdown")
        store.resume()
        assert result.get(timeout=30) == "fine"


@pytest.mark.parametrize(
    ("visibility", "hard_limit", "cap"), [(3600, 600, 2940.0), (700, 600, 40.0), (600, 600, 1.0)]
)
def test_a_countdown_and_its_run_fit_in_the_visibility_timeout(
    visibility: float, hard_limit: float, cap: float
) -> None:
    app = Celery("caps", broker="redis://127.0.0.1:1/0")  # never connected to
    app.conf.broker_transport_options = {"visibility_timeout": visibility}
    app.conf.task_time_limit = hard_limit

    class Probe:
        pass

    task: Any = Probe()
    task.app = app
    assert countdown_cap_s(task) == cap
