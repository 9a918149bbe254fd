"""Celery edge: what the broker's transport asks of governed tasks (Redis or RabbitMQ).

A late-acknowledged task is delivered again if the broker thinks its consumer
gave up on it, while it may still be running. Each broker has its own clock
for that, and `configure_worker` checks the governed tasks' hard time limit
against the one of the app's broker:

- Redis (and other virtual transports, such as SQS): the transport option
  ``visibility_timeout``, derived from the hard limit unless the app sets it,
  refused when it is not longer than the hard limit.
- RabbitMQ (``amqp``, ``pyamqp``, ``amqps``): the broker's ``consumer_timeout``
  (``rabbitmq.conf``, 30 min by default; per queue with a ``consumer-timeout``
  policy or an ``x-consumer-timeout`` argument on RabbitMQ 3.12 and later, for
  the queue types that honour one): a
  delivery unacknowledged longer closes the worker's channel and the message is
  delivered again. The client cannot read it, so the worker is told it
  (``consumer_timeout_s``) and refuses a hard limit that does not fit. The
  transport ignores ``visibility_timeout``. Publishes wait for the broker's
  confirm (``confirm_publish``): a parked task's release forgets nothing the
  broker has not taken, and a refused publish raises.

Every broker URL is checked before kombu reads it (`check_broker_urls`): a
password with an unescaped ``#`` would otherwise make kombu raise an error that
quotes the start of it. No error raised here holds any part of a URL.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from polygate_celery.celery.app_state import BrokerSeen, governance_of
from polygate_celery.config.urls import check_broker_url
from polygate_celery.errors import ConfigError

logger = logging.getLogger("polygate_celery")
AMQP = "amqp"  # kombu's driver type of the RabbitMQ transports (py-amqp, librabbitmq)
RABBITMQ_CONSUMER_TIMEOUT_S = 1800.0  # RabbitMQ's default consumer_timeout (1,800,000 ms)
REDIS_VISIBILITY_TIMEOUT_S = 3600.0  # kombu's default visibility_timeout


BROKER_URL_SETTINGS = ("broker_url", "broker_read_url", "broker_write_url")


def check_broker_urls(app: Celery) -> None:
    """Raise `ConfigError` naming the setting (never quoting the URL: it may hold a
    password) when a broker URL of `app` does not parse as written."""
    for setting in BROKER_URL_SETTINGS:
        value: Any = app.conf.get(setting)
        urls = value if isinstance(value, (list, tuple)) else [value]
        for url in (u for u in urls if u):
            try:
                check_broker_url(str(url))
            except ValueError as exc:
                raise ConfigError(setting, str(exc)) from None


def transport_kind(app: Celery, url: str | None) -> str:
    """kombu's driver type (``amqp``, ``redis``, ``sqs``...) of the transport of broker
    `url` of `app`. No URL is Celery's default, ``amqp://``. kombu's own errors become a
    `ConfigError` that quotes no part of the URL."""
    check_broker_urls(app)
    if url is not None:
        try:
            check_broker_url(url)
        except ValueError as exc:
            raise ConfigError("broker_url", str(exc)) from None
    try:
        connection = app.connection_for_write(url)  # not connected
        return str(connection.get_transport_cls().driver_type)
    except ImportError:  # the transport's client library is missing: Celery fails too
        return str(url or AMQP).split(":", 1)[0]
    except Exception:
        scheme = str(url or app.conf.broker_url or AMQP).partition("://")[0]
        raise ConfigError(
            "broker_url", f"kombu cannot use it (scheme {scheme!r}, or the URL's form)"
        ) from None


def broker_kinds(app: Celery) -> frozenset[str]:
    """The transports `app`'s workers consume from and publish to: one, unless the app
    sets ``broker_read_url`` and ``broker_write_url`` apart."""
    urls = (app.conf.broker_read_url, app.conf.broker_write_url)
    return frozenset(transport_kind(app, url) for url in urls)


def transport_options(
    app: Celery, hard_limit_s: float, visibility_margin_s: float, consumer_timeout_s: float
) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    """The app's ``broker_transport_options`` with what governed tasks need merged in, and
    notes for the log (what has no effect). Raises `ConfigError` for a broker that would
    deliver a task again while it still runs.

    What holds a delivery unacknowledged is the broker the workers consume from
    (``broker_read_url``); what confirms a publish is the one they publish to."""
    options = dict(app.conf.broker_transport_options or {})
    notes: list[tuple[int, str]] = []
    consumed = transport_kind(app, app.conf.broker_read_url)
    if consumed != AMQP:
        _visibility(options, hard_limit_s, visibility_margin_s)
    else:
        check_consumer_timeout(hard_limit_s, consumer_timeout_s)
        if "visibility_timeout" in options:
            notes.append(
                (
                    logging.INFO,
                    "broker_transport_options.visibility_timeout has no effect on RabbitMQ: "
                    "its consumer_timeout bounds how long a task may run (consumer_timeout_s)",
                )
            )
    if transport_kind(app, app.conf.broker_write_url) == AMQP:
        if options.get("confirm_publish") is False:
            notes.append(
                (
                    logging.WARNING,
                    "broker_transport_options.confirm_publish = False is replaced by True: "
                    "a parked task's release forgets it only once the broker confirms it",
                )
            )
        options["confirm_publish"] = True
    return options, notes


def _visibility(options: dict[str, Any], hard_limit_s: float, margin_s: float) -> None:
    visibility = options.get("visibility_timeout")
    if visibility is None:
        visibility = hard_limit_s + margin_s
    elif float(visibility) <= hard_limit_s:
        raise ConfigError(
            "broker_transport_options.visibility_timeout",
            f"{visibility} s would redeliver a task still running "
            f"(hard time limit {hard_limit_s:g} s)",
        )
    options["visibility_timeout"] = visibility
    # kombu sweeps for unacknowledged messages past the visibility timeout only on
    # every 10th check, 10 s apart: a lost worker's task came back up to ~100 s late.
    # Every check sweeps instead (one mutex and one small ZRANGE per worker per 10 s).
    options.setdefault("unacked_restore_throttle", 1)


def check_consumer_timeout(hard_limit_s: float, consumer_timeout_s: float) -> None:
    """Refuse a RabbitMQ consumer_timeout that a governed task's run could outlast."""
    if not consumer_timeout_s > 0:
        raise ConfigError("consumer_timeout_s", "must be positive (math.inf: no timeout)")
    if hard_limit_s >= consumer_timeout_s:
        raise ConfigError(
            "consumer_timeout_s",
            f"RabbitMQ's consumer_timeout ({consumer_timeout_s:g} s) is not longer than the "
            f"governed tasks' hard time limit ({hard_limit_s:g} s): a task still running "
            "at that point would have its channel closed and be delivered again. Raise "
            "consumer_timeout on the broker (rabbitmq.conf, in ms, or a consumer-timeout "
            "policy on the workers' queues) and pass it as configure_worker(..., "
            "consumer_timeout_s=...), or lower calls_per_task or the scopes' max_call_s",
        )


def remember_broker(app: Celery, consumer_timeout_s: float) -> None:
    """Keep, in `app`'s governance, the transports `configure_worker` configured it for and
    the consumer timeout it was told (`check_broker_unchanged`, `unacked_window_s`)."""
    governance_of(app).broker = BrokerSeen(broker_kinds(app), consumer_timeout_s)


def check_broker_unchanged(app: Celery) -> bool:
    """Log an error (and return False) when the app's broker is not of the transport
    `configure_worker` configured it for (its ``broker_url`` was set afterwards)."""
    broker, now = governance_of(app).broker, broker_kinds(app)
    if broker is None or broker.kinds == now:
        return True
    seen = broker.kinds
    logger.error(
        "configure_worker configured app %r for a %s broker, but it uses %s: call "
        "configure_worker once broker_url is set",
        app.main,
        "/".join(sorted(seen)),
        "/".join(sorted(now)),
    )
    return False


def unacked_window_s(app: Celery) -> float:
    """How long `app`'s broker leaves a delivered message with its consumer, unacknowledged,
    before delivering it again: the consumer timeout on RabbitMQ (as `configure_worker`
    was told it), else the visibility timeout."""
    if transport_kind(app, app.conf.broker_read_url) == AMQP:
        broker = governance_of(app).broker
        return broker.consumer_timeout_s if broker is not None else RABBITMQ_CONSUMER_TIMEOUT_S
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT_S))
