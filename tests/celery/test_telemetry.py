"""Telemetry from workers: hooks given to configure_worker, deferral events, prefork metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from polygate_celery.celery import DEFERRED
from polygate_celery.telemetry import AttemptEvent, DeferralEvent, VerdictEvent
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import app, ask, resets_then_estimates
from tests.celery.conftest import Worker, config_data
from tests.celery.test_outcomes import DEFER_PAUSE_S, pause, wait_for_state
from tests.celery.workers import celery_worker
from tests.conftest import Recorder


def test_configure_worker_hands_its_hooks_to_every_runtime(
    governed_worker: Worker, recorder: Recorder
) -> None:
    with governed_worker(hooks=[recorder]) as runtime:
        assert runtime.telemetry.active
        assert ask.delay("hi").get(timeout=20) == "fine"
    (attempt,) = recorder.of(AttemptEvent)
    assert (attempt.scope, attempt.record.source, attempt.record.outcome) == (
        "chat",
        "main",
        "success",
    )
    assert [v.verdict for v in recorder.of(VerdictEvent)] == ["success"]


def test_a_deferral_is_an_event(governed_worker: Worker, recorder: Recorder) -> None:
    with governed_worker(hooks=[recorder]) as runtime:
        pause(runtime, "main", DEFER_PAUSE_S)
        result = ask.delay("now or later", fail_fast=True)
        wait_for_state(result, DEFERRED)
        assert result.get(timeout=30) == "fine"
    first = recorder.of(DeferralEvent)[0]
    assert (first.scope, first.reason, first.deferrals, first.strategy) == (
        "chat",
        "fail_fast",
        1,
        "park",
    )
    assert first.delay_s >= 0.2  # the configured min_delay_s
    assert first.retry_after_s is not None


def test_a_rate_limit_reset_is_neither_grown_nor_counted_for_growth(
    governed_worker: Worker, recorder: Recorder
) -> None:
    with governed_worker(hooks=[recorder]):
        assert resets_then_estimates.delay().get(timeout=30) == "done"
    events = recorder.of(DeferralEvent)
    assert [e.deferrals for e in events] == [1, 2, 3, 4]
    delays = [e.delay_s for e in events]
    assert all(0.3 <= d <= 0.3 * 1.25 for d in delays[:3])  # resets, then the 1st estimate
    assert 0.6 <= delays[3] <= 0.6 * 1.25  # the 2nd estimate grows once


def test_prefork_pool_processes_count_into_one_multiprocess_directory(
    provider: SimulatedProvider, redis_url: str, broker: str, tmp_path: Path
) -> None:
    prefix = f"metrics-{tmp_path.name[-12:]}"
    config = config_data(provider, redis_url, prefix)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    app.conf.update(broker_url=broker, result_backend=broker, task_default_queue="polygate-tests")
    settings = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    with celery_worker(config, broker, tmp_path, concurrency=2, settings=settings):
        results = [ask.delay(f"n{i}") for i in range(8)]
        assert [r.get(timeout=60) for r in results] == ["fine"] * 8

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    labels: dict[str, Any] = {"scope": "chat", "source": "main", "outcome": "success"}
    assert registry.get_sample_value("polygate_attempts_total", labels) == 8
    verdicts = {"scope": "chat", "verdict": "success", "priority": "", "tenant": ""}
    assert registry.get_sample_value("polygate_verdicts_total", verdicts) == 8
