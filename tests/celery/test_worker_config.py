"""configure_worker: the settings governed tasks rely on, derived and checked."""

from __future__ import annotations

import logging
import math
import traceback

import pytest
from celery import Celery, signals

from polygate_celery import ConfigError, parse_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed
from polygate_celery.celery.broker import broker_kinds, check_broker_unchanged
from polygate_celery.celery.deferral import countdown_cap_s
from polygate_celery.celery.runtime import reset_runtime
from polygate_celery.celery.worker import (
    apply_time_limits,
    check_eviction_policy,
    time_limits,
    worker_settings,
)
from tests.redis_server import RedisServer

REDIS_BROKER = "redis://127.0.0.1:1/0"  # never connected to: these tests read settings
CONFIG = {
    "sources": {"a": {"timeout_s": 60, "base_url": "http://127.0.0.1:9/v1", "model": "m"}},
    "scopes": {"s": {"kind": "chat", "sources": ["a"], "max_attempts": 3, "stall_window_s": 100}},
}


def test_the_settings_for_at_least_once_never_lost() -> None:
    app = Celery("configured", broker=REDIS_BROKER)
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
    app = Celery("restore", broker=REDIS_BROKER)
    configure_worker(app, parse_config(CONFIG))
    assert app.conf.broker_transport_options["unacked_restore_throttle"] == 1
    mine = Celery("restore-mine", broker=REDIS_BROKER)
    mine.conf.broker_transport_options = {"unacked_restore_throttle": 5}
    configure_worker(mine, parse_config(CONFIG))
    assert mine.conf.broker_transport_options["unacked_restore_throttle"] == 5  # theirs kept


def test_a_visibility_timeout_that_would_redeliver_a_running_task_is_refused() -> None:
    app = Celery("too-short", broker=REDIS_BROKER)
    app.conf.broker_transport_options = {"visibility_timeout": 300}
    with pytest.raises(ConfigError) as caught:
        configure_worker(app, parse_config(CONFIG))
    assert caught.value.field == "broker_transport_options.visibility_timeout"


def test_a_long_enough_visibility_timeout_is_kept() -> None:
    app = Celery("long-enough", broker=REDIS_BROKER)
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


# -- RabbitMQ: no visibility timeout; the hard limit within its consumer_timeout; confirms ------

RABBITMQ = "amqp://guest@127.0.0.1:1//"  # never connected to


@pytest.mark.parametrize(
    ("broker", "kind"),
    [
        (None, "amqp"),  # Celery's default broker is amqp://guest@localhost//
        ("amqp://guest@rabbit//", "amqp"),
        ("pyamqp://guest@rabbit//", "amqp"),
        ("amqps://guest@rabbit//", "amqp"),
        ("redis://127.0.0.1:1/0", "redis"),
        ("rediss://127.0.0.1:1/0", "redis"),
        ("sentinel://127.0.0.1:1", "redis"),
    ],
)
def test_the_transport_comes_from_the_broker_url(broker: str | None, kind: str) -> None:
    app = Celery("kinds", broker=broker, set_as_current=False)
    assert broker_kinds(app) == {kind}
    options = worker_settings(app, parse_config(CONFIG))["broker_transport_options"]
    if kind == "amqp":
        assert options == {"confirm_publish": True}
    else:
        assert set(options) == {"visibility_timeout", "unacked_restore_throttle"}


def test_on_rabbitmq_a_visibility_timeout_has_no_effect_and_is_not_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("rabbit-visibility", broker=RABBITMQ, set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 600}  # below the hard limit:
    with caplog.at_level(logging.INFO, logger="polygate_celery"):
        configure_worker(app, parse_config(CONFIG), calls_per_task=2)  # 2 x 380 + 60 + 82 s
    options = app.conf.broker_transport_options
    assert options["confirm_publish"] is True  # the release returns once the broker has it
    assert "unacked_restore_throttle" not in options  # a Redis transport option
    assert options["visibility_timeout"] == 600  # the user's, untouched, and ignored by py-amqp
    assert "visibility_timeout has no effect on RabbitMQ" in caplog.text


def test_a_hard_limit_rabbitmq_would_outlast_is_refused_until_its_timeout_is_raised() -> None:
    # max_call_s = 380; five calls and 60 s: soft 1,960 s, hard 2,156 s > 30 min.
    app = Celery("rabbit-too-long", broker=RABBITMQ, set_as_current=False)
    with pytest.raises(ConfigError) as caught:
        configure_worker(app, parse_config(CONFIG), calls_per_task=5)
    assert caught.value.field == "consumer_timeout_s"
    message = str(caught.value)
    assert "consumer_timeout (1800 s)" in message
    assert "hard time limit (2156 s)" in message
    assert "Raise consumer_timeout on the broker" in message
    assert "consumer_timeout_s=" in message
    assert "lower calls_per_task or the scopes' max_call_s" in message
    assert app.conf.task_acks_late is False  # nothing was applied
    settings = configure_worker(
        app, parse_config(CONFIG), calls_per_task=5, consumer_timeout_s=3600
    )
    assert settings["broker_transport_options"] == {"confirm_publish": True}
    configure_worker(app, parse_config(CONFIG), calls_per_task=5, consumer_timeout_s=math.inf)


def test_an_apps_own_hard_limit_is_checked_against_the_consumer_timeout_too() -> None:
    app = Celery("rabbit-own-limit", broker=RABBITMQ, set_as_current=False)
    app.conf.task_time_limit = 1800
    with pytest.raises(ConfigError, match="hard time limit \\(1800 s\\)") as caught:
        configure_worker(app, parse_config(CONFIG))
    assert caught.value.field == "consumer_timeout_s"
    with pytest.raises(ConfigError, match="must be positive"):
        configure_worker(app, parse_config(CONFIG), consumer_timeout_s=0)


def test_a_users_confirm_publish_false_is_replaced_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("rabbit-no-confirms", broker=RABBITMQ, set_as_current=False)
    app.conf.broker_transport_options = {"confirm_publish": False, "max_retries": 3}
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        configure_worker(app, parse_config(CONFIG))
    assert app.conf.broker_transport_options == {"confirm_publish": True, "max_retries": 3}
    assert "confirm_publish = False is replaced by True" in caplog.text


@pytest.mark.parametrize(("consumer_timeout_s", "cap"), [(1800.0, 1322.0), (7200.0, 6722.0)])
def test_a_countdown_and_its_run_fit_in_the_consumer_timeout(
    consumer_timeout_s: float, cap: float
) -> None:
    app = Celery("rabbit-caps", broker=RABBITMQ, set_as_current=False)
    config = parse_config(CONFIG)
    configure_worker(app, config, extra_task_s=0, consumer_timeout_s=consumer_timeout_s)

    @app.task(name="rabbit-caps.governed", shared=False)
    @governed("s")
    def governed_task(calls: GovernedCalls) -> None:  # pragma: no cover
        pass

    apply_time_limits(app)  # what the worker does at start: hard limit 380 + 38 = 418 s
    assert governed_task.time_limit == 418
    assert countdown_cap_s(governed_task) == cap  # the timeout, less the run, less 60 s


def test_a_broker_set_after_configure_worker_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("late-broker", set_as_current=False)
    configure_worker(app, parse_config(CONFIG))  # before the broker: Celery's default, amqp
    assert check_broker_unchanged(app) is True
    app.conf.broker_url = REDIS_BROKER
    with caplog.at_level(logging.ERROR, logger="polygate_celery"):
        assert check_broker_unchanged(app) is False
    assert "configured app 'late-broker' for a amqp broker, but it uses redis" in caplog.text


def test_read_and_write_brokers_apart_each_get_what_their_side_needs() -> None:
    consume_rabbitmq = Celery("split", broker=REDIS_BROKER, set_as_current=False)
    consume_rabbitmq.conf.broker_read_url = RABBITMQ  # deliveries held: the consumer timeout
    with pytest.raises(ConfigError, match="consumer_timeout"):
        worker_settings(consume_rabbitmq, parse_config(CONFIG), calls_per_task=5)
    assert worker_settings(consume_rabbitmq, parse_config(CONFIG))["broker_transport_options"] == {}
    publish_rabbitmq = Celery("split", broker=REDIS_BROKER, set_as_current=False)
    publish_rabbitmq.conf.broker_write_url = RABBITMQ  # publishes confirmed
    options = worker_settings(publish_rabbitmq, parse_config(CONFIG))["broker_transport_options"]
    assert set(options) == {"visibility_timeout", "unacked_restore_throttle", "confirm_publish"}


BROKER_PASSWORD = "BRKq7Zx9Wv"


@pytest.mark.parametrize(
    "broker",
    [
        f"redis://:{BROKER_PASSWORD}#@%:7@broker/0",  # kombu would read the password as a port
        f"redis://:{BROKER_PASSWORD[:3]}#{BROKER_PASSWORD[3:]}@broker/0",  # a silent fragment
        f"amqp://guest:{BROKER_PASSWORD}/x@rabbit//",
        f"nosuch://guest:{BROKER_PASSWORD}@rabbit//",
    ],
    ids=["hash-port", "hash-fragment", "slash", "unknown-transport"],
)
def test_configure_worker_refuses_a_broker_url_by_name_without_its_password(
    broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("unparsed-broker", broker=broker, set_as_current=False)
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError) as caught:
        configure_worker(app, parse_config(CONFIG))
    assert caught.value.field == "broker_url"
    printed = "".join(traceback.format_exception(caught.value)) + caplog.text
    for i in range(len(BROKER_PASSWORD) - 2):
        assert BROKER_PASSWORD[i : i + 3] not in printed


def test_a_read_url_apart_is_checked_too() -> None:
    app = Celery("unparsed-read", broker=REDIS_BROKER, set_as_current=False)
    app.conf.broker_read_url = f"redis://:{BROKER_PASSWORD}#@broker/0"
    with pytest.raises(ConfigError) as caught:
        worker_settings(app, parse_config(CONFIG))
    assert caught.value.field == "broker_read_url"
    assert BROKER_PASSWORD not in str(caught.value)
