"""Celery tests: a real Redis broker, in-process workers (celery.contrib.testing), the
simulated provider. Each test gets its own queue, key prefix and configuration."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import redis as sync_redis
from celery.contrib.testing.worker import start_worker

from polygate_celery import GatewayConfig, parse_config
from polygate_celery.celery import configure_worker
from polygate_celery.celery.runtime import reset_runtime, runtime_for
from polygate_celery.telemetry import TelemetryHook
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.celery.app import app
from tests.celery.rabbitmq import rabbitmq_vhost  # noqa: F401 - a fixture
from tests.conftest import own_redis

MODELS = {
    "up": ModelBehaviour(reply="fine"),
    "second": ModelBehaviour(reply="second answer"),
    "broken": ModelBehaviour(error_rates={500: 1.0}),
    "slow": ModelBehaviour(reply="slow answer", latency_s=(20.0, 20.0)),
    "killable": ModelBehaviour(reply="survived", latency_s=(0.6, 0.6)),
    "steady": ModelBehaviour(reply="fine", latency_s=(0.3, 0.3)),
}


@pytest.fixture(scope="session")
def provider() -> Iterator[SimulatedProvider]:
    with SimulatedProvider(MODELS) as provider:
        yield provider


@pytest.fixture(scope="session")
def broker_server() -> Iterator[str]:
    """The session's broker and result backend: a private Redis, so that no other run on
    the machine shares (or empties) its queues, unacknowledged messages and results."""
    with own_redis() as url:
        yield url


@pytest.fixture
def broker(broker_server: str) -> Iterator[str]:
    """The broker and result backend, emptied after each test."""
    yield broker_server
    sync_redis.Redis.from_url(broker_server).flushdb()


def config_data(
    provider: SimulatedProvider, redis_url: str, prefix: str, **overrides: Any
) -> dict[str, Any]:
    scope = {
        "max_attempts": 2,
        "stall_window_s": 1.0,
        "poll_interval_s": 0.1,
        "backoff_base_s": 0.05,
        "backoff_max_s": 0.2,
        **overrides.pop("scope", {}),
    }
    data: dict[str, Any] = {
        "store": {"redis_url": redis_url, "key_prefix": prefix, "lease_s": 10},
        "deferral": {
            "min_delay_s": 0.2,
            "max_delay_s": 2,
            "release_interval_s": 0.05,
            **overrides.pop("deferral", {}),
        },
        "sources": {
            "main": {
                "base_url": provider.url,
                "model": overrides.pop("model", "up"),
                "timeout_s": 2,
            },
            "other": {"base_url": provider.url, "model": "second", "timeout_s": 2},
        },
        "scopes": {
            "chat": {"kind": "chat", "sources": ["main"], **scope},
            "second": {"kind": "chat", "sources": ["other"], **scope},
        },
    }
    for name, model in overrides.pop("extra_sources", {}).items():
        data["sources"][name] = {
            "base_url": provider.url,
            "model": model,
            "timeout_s": 30,
            "max_concurrency": 1,
        }
        data["scopes"][name] = {
            "kind": "chat",
            "sources": [name],
            **scope,
            "max_call_s": 60,
            "stall_window_s": 10,
        }
    data.update(overrides)
    return data


def make_config(
    provider: SimulatedProvider, redis_url: str, prefix: str, **overrides: Any
) -> GatewayConfig:
    return parse_config(config_data(provider, redis_url, prefix, **overrides))


Worker = Callable[..., Any]


@pytest.fixture
def governed_worker(provider: SimulatedProvider, redis_url: str, broker: str) -> Iterator[Worker]:
    """Start an in-process worker for the test app with a configuration of the test's own."""
    prefix = f"celery-{uuid.uuid4().hex[:10]}"
    queue = "polygate-tests"  # the app caches its queues; the broker's database is emptied

    @contextmanager
    def start(
        pool: str = "threads",
        concurrency: int = 4,
        hooks: Sequence[TelemetryHook] = (),
        **overrides: Any,
    ) -> Iterator[Any]:
        config = make_config(provider, redis_url, prefix, **overrides)
        app.conf.update(broker_url=broker, result_backend=broker, task_default_queue=queue)
        app.conf.broker_transport_options = {}
        configure_worker(app, config, extra_task_s=20, hooks=hooks)
        reset_runtime(app)
        with start_worker(
            app, pool=pool, concurrency=concurrency, perform_ping_check=False, shutdown_timeout=30
        ):
            yield runtime_for(app)
        reset_runtime(app)

    yield start
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)
