"""configure_worker: the settings governed tasks rely on, derived and checked."""

from __future__ import annotations

import logging

import pytest
from celery import Celery, signals

from polygate_celery import ConfigError, parse_config
from polygate_celery.celery import (
    GovernedCalls,
    check_eviction_policy,
    configure_worker,
    governed,
    time_limits,
)
from polygate_celery.celery.runtime import reset_runtime
from tests.redis_server import RedisServer

CONFIG = {
    "sources": {"a": {"timeout_s": 60, "base_url": "http://127.0.0.1:9/v1", "model": "m"}},
    "scopes": {"s": {"kind": "chat", "sources": ["a"], "max_attempts": 3, "stall_window_s": 100}},
}


def test_the_settings_for_at_least_once_never_lost() -> None:
    app = Celery("configured")
    settings = configure_worker(app, parse_config(CONFIG), calls_per_task=2, extra_task_s=60)
    conf = app.conf
    assert (conf.task_acks_late, conf.task_reject_on_worker_lost) == (True, True)
    assert conf.worker_prefetch_multiplier == 1
    assert conf.accept_content == ["json"]
    assert conf.result_accept_content == ["json"]
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is False  # copies wait
    assert conf.result_backend_always_retry is True  # a result is stored once Redis is back
    assert conf.task_publish_retry_policy["max_retries"] == 20  # rides out a broker restart
    # Time limits go to the governed tasks alone, at worker start.
    assert conf.task_soft_time_limit is None
    assert conf.task_time_limit is None
    assert "task_time_limit" not in settings

    @app.task(name="configured.governed", shared=False)
    @governed("s")
    def governed_task(calls: GovernedCalls) -> None:  # pragma: no cover
        pass

    @app.task(name="configured.plain", shared=False)
    def plain_task() -> None:  # pragma: no cover
        pass

    @app.task(name="configured.own", soft_time_limit=5, time_limit=10, shared=False)
    @governed("s")
    def own_limits(calls: GovernedCalls) -> None:  # pragma: no cover
        pass

    class Worker:
        def __init__(self, app: Celery) -> None:
            self.app = app

    signals.worker_init.send(sender=Worker(app))
    # max_call_s = 3 * 60 + 2 * 100 = 380; two calls and 60 s more.
    soft = 2 * 380 + 60
    assert (governed_task.soft_time_limit, plain_task.soft_time_limit) == (soft, None)
    assert governed_task.time_limit > soft
    assert plain_task.time_limit is None
    assert (own_limits.soft_time_limit, own_limits.time_limit) == (5, 10)  # its own kept
    assert settings["broker_transport_options"]["visibility_timeout"] > governed_task.time_limit


def test_a_lost_workers_task_is_looked_for_at_every_restore_check() -> None:
    app = Celery("restore")
    configure_worker(app, parse_config(CONFIG))
    assert app.conf.broker_transport_options["unacked_restore_throttle"] == 1
    mine = Celery("restore-mine")
    mine.conf.broker_transport_options = {"unacked_restore_throttle": 5}
    configure_worker(mine, parse_config(CONFIG))
    assert mine.conf.broker_transport_options["unacked_restore_throttle"] == 5  # theirs kept


def test_a_visibility_timeout_that_would_redeliver_a_running_task_is_refused() -> None:
    app = Celery("too-short")
    app.conf.broker_transport_options = {"visibility_timeout": 300}
    with pytest.raises(ConfigError) as caught:
        configure_worker(app, parse_config(CONFIG))
    assert caught.value.field == "broker_transport_options.visibility_timeout"


def test_a_long_enough_visibility_timeout_is_kept() -> None:
    app = Celery("long-enough")
    app.conf.broker_transport_options = {"visibility_timeout": 10_000}
    configure_worker(app, parse_config(CONFIG))
    assert app.conf.broker_transport_options["visibility_timeout"] == 10_000


def test_time_limits_come_from_the_worst_scope() -> None:
    soft, hard = time_limits(parse_config(CONFIG), calls_per_task=1, extra_s=0)
    assert (soft, hard) == (380.0, 380.0 + 38.0)


@pytest.mark.parametrize(("policy", "warns"), [("allkeys-lru", True), ("noeviction", False)])
def test_an_eviction_policy_that_could_drop_governance_keys_is_reported(
    policy: str, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with RedisServer() as server:
        import redis  # noqa: PLC0415

        redis.Redis.from_url(server.url).config_set("maxmemory-policy", policy)
        app = Celery("eviction")
        configure_worker(app, parse_config({**CONFIG, "store": {"redis_url": server.url}}))
        try:
            with caplog.at_level(logging.WARNING, logger="polygate_celery"):
                assert check_eviction_policy(app) == policy
        finally:
            reset_runtime(app)
    assert ("maxmemory-policy" in caplog.text) is warns
