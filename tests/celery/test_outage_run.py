"""An outage longer than the stall window, across 1,000 tasks: deferred, never lost."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis as sync_redis

from polygate_celery import AllSourcesExhausted
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.celery.app import record
from tests.celery.conftest import Worker
from tests.conftest import Figures
from tests.soak import size

TASKS = size(ci=300, soak=1_000)
OUTAGE_S = 8.0
WINDOW_S = 5.0


@pytest.fixture
def outage_provider() -> Iterator[SimulatedProvider]:
    """A provider that is down for its first OUTAGE_S seconds."""
    models = {"up": ModelBehaviour(reply="fine", outages=((0.0, OUTAGE_S),))}
    with SimulatedProvider(models) as provider:
        yield provider


def outage_settings(provider: SimulatedProvider, max_attempts: int) -> dict[str, Any]:
    return {
        "scope": {"stall_window_s": WINDOW_S, "max_attempts": max_attempts, "poll_interval_s": 0.2},
        "deferral": {"min_delay_s": 0.5, "max_delay_s": 4.0, "max_deferrals": 50},
        "sources": {
            "main": {
                "base_url": provider.url,
                "model": "up",
                "timeout_s": 2,
                "max_concurrency": 16,
                "breaker": {"failure_threshold": 3, "cooldown_s": 1.0},
            },
            "other": {"base_url": provider.url, "model": "up", "timeout_s": 2},
        },
    }


def test_an_outage_longer_than_the_stall_window_defers_and_loses_nothing(
    governed_worker: Worker, outage_provider: SimulatedProvider, broker: str, figures: Figures
) -> None:
    started = time.monotonic()
    with governed_worker(concurrency=16, **outage_settings(outage_provider, max_attempts=10)):
        results = [record.delay(f"task {i}") for i in range(TASKS)]
        outcomes = [r.get(timeout=240, propagate=False) for r in results]
        states = Counter(r.state for r in results)
    took = time.monotonic() - started
    client = sync_redis.Redis.from_url(broker)
    deferrals = Counter()
    for result in results:
        runs = [int(x) for x in client.lrange(f"deferrals:{result.id}", 0, -1)]
        assert runs == list(range(len(runs))), (result.id, runs)  # executions = deferrals + 1
        deferrals[len(runs) - 1] += 1
    figures(
        f"{TASKS} tasks in {took:.0f} s: {dict(states)}; tasks by deferral count "
        f"{dict(sorted(deferrals.items()))}"
    )
    assert states == {"SUCCESS": TASKS}
    assert outcomes == ["fine"] * TASKS
    assert sum(n * k for n, k in deferrals.items()) > 0  # the outage did defer tasks


def test_with_the_retry_budget_spent_the_outage_fails_tasks(
    governed_worker: Worker, outage_provider: SimulatedProvider
) -> None:
    settings = outage_settings(outage_provider, max_attempts=1)
    settings["sources"]["main"]["breaker"]["failure_threshold"] = 1000  # never opens
    with governed_worker(concurrency=8, **settings):
        results = [record.delay(f"task {i}") for i in range(50)]
        errors = [r.get(timeout=60, propagate=False) for r in results]
    assert all(isinstance(e, AllSourcesExhausted) for e in errors)
    assert {e.reason for e in errors} == {"retry_exhausted"}
