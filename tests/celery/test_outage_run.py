"""An outage longer than the stall window, across 1,000 tasks: deferred, never lost."""

from __future__ import annotations

import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis

from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.celery.app import app, ask, record
from tests.celery.conftest import Worker
from tests.celery.workers import celery_worker
from tests.conftest import Figures
from tests.soak import size

TASKS = size(ci=300, soak=1_000)
OUTAGE_S = 8.0
WINDOW_S = 5.0
POLL_S = 0.2
# A task that began this long before the outage's end met WINDOW_S of it, with time
# to spare for its run's first steps and a poll: its call must have stalled.
MET_THE_WINDOW_S = WINDOW_S + 2.0


@pytest.fixture
def outage_provider() -> Iterator[SimulatedProvider]:
    """A provider that is down for OUTAGE_S seconds from its first request, however
    long the worker takes to start."""
    models = {"up": ModelBehaviour(reply="fine", outages=((0.0, OUTAGE_S),), outages_from="up")}
    with SimulatedProvider(models) as provider:
        yield provider


def outage_settings(provider: SimulatedProvider) -> dict[str, Any]:
    """The test worker's fast settings, with the retry budget, the breaker and the
    deferral budget at their defaults (the fixture's `max_attempts` of 2 is the only
    other override)."""
    return {
        "scope": {"stall_window_s": WINDOW_S, "max_attempts": 3, "poll_interval_s": POLL_S},
        "deferral": {"min_delay_s": 0.5, "max_delay_s": 4.0},
        "sources": {
            "main": {"base_url": provider.url, "model": "up", "timeout_s": 2},
            "other": {"base_url": provider.url, "model": "up", "timeout_s": 2},
        },
    }


def test_an_outage_longer_than_the_stall_window_defers_and_loses_nothing(
    governed_worker: Worker, outage_provider: SimulatedProvider, broker: str, figures: Figures
) -> None:
    started = time.monotonic()
    with governed_worker(concurrency=16, **outage_settings(outage_provider)):
        results = [record.delay(f"task {i}") for i in range(TASKS)]
        outcomes = [r.get(timeout=240, propagate=False) for r in results]
        states = Counter(r.state for r in results)
    took = time.monotonic() - started
    first_request = outage_provider.first_request_at("up")
    assert first_request is not None
    outage_ends = time.monotonic() - outage_provider.since_start() + first_request + OUTAGE_S
    client = sync_redis.Redis.from_url(broker)
    deferrals: Counter[int] = Counter()
    met_it = []  # the tasks whose first run met a stall window of the outage
    for result in results:
        runs = [int(x) for x in client.lrange(f"deferrals:{result.id}", 0, -1)]
        assert runs == list(range(len(runs))), (result.id, runs)  # executions = deferrals + 1
        deferrals[len(runs) - 1] += 1
        began = float(client.lindex(f"began:{result.id}", 0) or "inf")
        if began < outage_ends - MET_THE_WINDOW_S:
            met_it.append((result.id, len(runs) - 1))
    figures(
        f"{TASKS} tasks in {took:.0f} s: {dict(states)}; tasks by deferral count "
        f"{dict(sorted(deferrals.items()))}; {len(met_it)} began at least "
        f"{MET_THE_WINDOW_S:.0f} s before the outage's end"
    )
    assert states == {"SUCCESS": TASKS}
    assert outcomes == ["fine"] * TASKS
    # The task that met the outage first began before its first request: it is among them.
    assert met_it, "no task began in the outage"
    assert [task for task, deferred in met_it if deferred == 0] == []


@pytest.fixture
def poison_provider() -> Iterator[SimulatedProvider]:
    """A provider that serves every request but those that mention "poison"."""
    models = {"up": ModelBehaviour(reply="fine", poison="poison", latency_s=(0.2, 0.2))}
    with SimulatedProvider(models) as provider:
        yield provider


def test_a_request_that_fails_while_its_source_serves_others_fails_the_task(
    governed_worker: Worker, poison_provider: SimulatedProvider
) -> None:
    """Its failures are its own (SPEC §3 rule 15): the retry budget ends it, with
    the default `max_attempts`; the other tasks all succeed."""
    settings = outage_settings(poison_provider)
    settings["scope"].pop("max_attempts")
    with governed_worker(concurrency=8, **settings):
        doomed = [ask.delay(f"poison {i}") for i in range(3)]
        served: list[Any] = []
        while not all(r.ready() for r in doomed):  # keep the source serving others
            served += [ask.delay(f"fine {i}") for i in range(8)]
            time.sleep(0.5)
        errors = [r.get(timeout=60, propagate=False) for r in doomed]
        answers = [r.get(timeout=60) for r in served]
    assert [type(e).__name__ for e in errors] == ["AllSourcesExhausted"] * 3
    assert {e.reason for e in errors} == {"retry_exhausted"}
    assert {r.state for r in doomed} == {"FAILURE"}
    assert answers == ["fine"] * len(served)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_refused_then_503_with_default_settings_defers_every_task_on_prefork(
    broker: str, redis_url: str, tmp_path: Path, figures: Figures
) -> None:
    """The provider refuses connections for 4 s, then answers 503 for 4 s, then serves:
    200 tasks on a prefork worker, every setting at its default but the stall window
    (3 s) and the key prefix. None fails; all succeed once the source is back."""
    app.conf.update(broker_url=broker, result_backend=broker, task_default_queue="polygate-tests")
    port = free_port()
    prefix = f"outage-{uuid.uuid4().hex[:10]}"
    config = {
        "store": {"redis_url": redis_url, "key_prefix": prefix},
        "sources": {"main": {"base_url": f"http://127.0.0.1:{port}/v1", "model": "up"}},
        "scopes": {"chat": {"kind": "chat", "sources": ["main"], "stall_window_s": 3}},
    }
    started = time.monotonic()
    try:
        with celery_worker(config, broker, tmp_path, pool="prefork", concurrency=8):
            results = [ask.delay(f"task {i}") for i in range(200)]
            time.sleep(4.0)  # nothing listens: every connection is refused
            models = {"up": ModelBehaviour(reply="fine", outages=((0.0, 4.0),))}
            with SimulatedProvider(models, port=port) as provider:
                outcomes = [r.get(timeout=300, propagate=False) for r in results]
                states = Counter(r.state for r in results)
                answered = Counter(e.status for e in provider.journal)
    finally:
        client = sync_redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{{{prefix}}}*"):
            client.delete(key)
    figures(
        f"200 tasks, refused 4 s then 503 for 4 s, defaults: {dict(states)} in "
        f"{time.monotonic() - started:.0f} s; provider answers {dict(answered)}"
    )
    assert states == {"SUCCESS": 200}, [o for o in outcomes if o != "fine"][:3]
    assert outcomes == ["fine"] * 200
