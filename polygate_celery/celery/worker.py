"""Celery edge: the worker configuration governed tasks need, derived and checked.

`configure_worker(app, config)` sets what at-least-once, never-lost execution
relies on: late acknowledgement, redelivery of a lost worker's task, a
prefetch of one, JSON only, a soft shutdown, time limits derived from the
scopes' `max_call_s` on the governed tasks alone (given at worker start; a task
with limits of its own keeps them), and what the app's broker needs
(`polygate_celery.celery.broker`): on Redis a visibility timeout longer than the
hard time limit (a shorter one would redeliver a task that is still running:
refused); on RabbitMQ publisher confirms, and a hard time limit shorter than
the broker's consumer timeout (refused otherwise).
It also starts each worker process's parking-lot release loop, warns when
Redis could evict governance keys, and quiets the transport libraries'
per-request INFO lines (`quiet_transport_loggers`).

Worker loss with Redis as the broker: a task is redelivered only if the
broker's unacknowledged-message records survive, so run Redis with AOF
(``appendonly yes``) and a ``noeviction`` memory policy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from celery import Celery, signals
from celery.app.defaults import DEFAULTS

from polygate_celery.celery.app_state import governance_of
from polygate_celery.celery.broker import (
    RABBITMQ_CONSUMER_TIMEOUT_S,
    check_broker_unchanged,
    remember_broker,
    transport_options,
)
from polygate_celery.celery.chords import install_counting_request
from polygate_celery.celery.parking import Releaser, lot_name, probe_intervals
from polygate_celery.celery.priority import check_task_classes
from polygate_celery.celery.registry import governed_tasks
from polygate_celery.celery.runtime import (
    WorkerRuntime,
    register_config,
    registered_config,
    runtime_for,
)
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.errors import ConfigError
from polygate_celery.store.redis import eviction_policies
from polygate_celery.telemetry import TelemetryHook

logger = logging.getLogger("polygate_celery")
# Only noeviction is safe: the volatile-* policies evict keys with a TTL, which is what
# the duplicate guard's markers, the scope gates and the kept paid results are.
SAFE_EVICTION = {"noeviction"}
# About 30 s of retries, at most 2 s apart.
PUBLISH_RETRY_POLICY = {
    "max_retries": 20,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 2,
}


def time_limits(config: GatewayConfig, calls_per_task: int, extra_s: float) -> tuple[float, float]:
    """(soft, hard) task time limits: the worst case of `calls_per_task` governed calls,
    each with the stall window a governed task runs with (`for_governed_tasks`)."""
    governed = config.for_governed_tasks()
    worst = max((governed.max_call_s(name) for name in governed.scopes), default=0.0)
    soft = calls_per_task * worst + extra_s
    return soft, soft + max(30.0, 0.1 * soft)


def configure_worker(
    app: Celery,
    config: GatewayConfig,
    *,
    calls_per_task: int = 1,
    extra_task_s: float = 60.0,
    visibility_margin_s: float = 300.0,
    consumer_timeout_s: float = RABBITMQ_CONSUMER_TIMEOUT_S,
    hooks: Sequence[TelemetryHook] = (),
) -> dict[str, Any]:
    """Configure `app` for governed tasks.

    The broker is the app's (``broker_url``; Celery's default ``amqp://`` when
    none is set): call this once it is set. Time limits the app already sets
    are kept (and checked against the broker's visibility or consumer timeout);
    per-task ``time_limit`` options are not checked. The threads and solo pools
    do not enforce time limits at all: a run that outlives the broker's timeout
    there is delivered twice.

    Args:
        app: The Celery app whose tasks are governed.
        config: The configuration its workers use (`load_config`).
        calls_per_task: Governed calls one task makes at most, for the time limits.
        extra_task_s: Seconds a task spends beside its governed calls.
        visibility_margin_s: On a Redis broker, the visibility timeout is the
            hard time limit plus this, unless the app sets one.
        consumer_timeout_s: On RabbitMQ, the broker's ``consumer_timeout`` for
            the workers' queues (RabbitMQ's default 30 min; ``math.inf`` when
            disabled); a hard time limit that is not shorter is refused.
        hooks: Telemetry hooks for every worker process's governed calls and
            deferrals (e.g. `polygate_celery.metrics.PrometheusHook()`); a
            runtime made before this call keeps the hooks it had.

    Returns:
        The Celery settings it applied to ``app.conf``.

    Raises:
        ConfigError: A setting the broker cannot honour: a Redis visibility
            timeout or a RabbitMQ consumer timeout shorter than the hard time
            limit, a broker URL that does not parse, ``calls_per_task`` below 1; a
            task's ``@governed(priority=...)`` class undeclared (`check_task_classes`).
    """
    settings = worker_settings(
        app,
        config,
        calls_per_task=calls_per_task,
        extra_task_s=extra_task_s,
        visibility_margin_s=visibility_margin_s,
        consumer_timeout_s=consumer_timeout_s,
    )
    check_task_classes(app, config)
    governance = governance_of(app)
    governance.limits = governed_time_limits(app, config, calls_per_task, extra_task_s)
    remember_broker(app, consumer_timeout_s)
    hard = governance.limits[1]
    for level, note in transport_options(app, hard, visibility_margin_s, consumer_timeout_s)[1]:
        logger.log(level, "configure_worker: %s", note)
    for key, before, after in overridden_settings(app, settings):
        logger.warning(
            "configure_worker replaces %s = %r, set on app %r, by %r for every task: %s",
            key,
            before,
            app.main,
            after,
            WHY.get(key, "governed tasks rely on it"),
        )
    app.conf.update(settings)
    register_config(app, config, hooks)
    _connect_signals(app)
    return settings


WHY = {
    "task_acks_late": "a task is acknowledged once its outcome is stored (at least once)",
    "task_reject_on_worker_lost": "a lost worker's task is redelivered, not failed",
    "worker_prefetch_multiplier": "one reserved task per process: none waits behind a stall",
    "task_serializer": "Celery messages are JSON only",
    "result_serializer": "Celery messages are JSON only",
    "accept_content": "Celery messages are JSON only",
    "result_accept_content": "Celery messages are JSON only",
    "event_serializer": "Celery messages are JSON only",
    "worker_cancel_long_running_tasks_on_connection_loss": (
        "its cancel loses tasks (docs/concepts/guarantees.md)"
    ),
    "result_backend_always_retry": "a result stored during a Redis restart is retried",
    "task_publish_retry_policy": "publishes from a task ride out a broker restart",
}
_KEPT = {"broker_transport_options"}  # merged with the user's


def governed_time_limits(
    app: Celery, config: GatewayConfig, calls_per_task: int = 1, extra_s: float = 60.0
) -> tuple[float, float]:
    """(soft, hard) time limits of `app`'s governed tasks: the app's own when it sets them,
    else derived from the scopes (`time_limits`)."""
    soft, hard = time_limits(config, calls_per_task, extra_s)
    theirs_soft: float | None = app.conf.task_soft_time_limit
    theirs_hard: float | None = app.conf.task_time_limit
    return float(theirs_soft or soft), max(hard, float(theirs_hard or 0))


def apply_time_limits(app: Celery) -> dict[str, tuple[float, float]]:
    """Give each governed task of `app` that has no time limits of its own the ones
    `configure_worker` derived (at worker start, once the task modules are imported);
    other tasks keep Celery's (none, unless the app sets them). Returns what was set."""
    limits = governance_of(app).limits
    if limits is None:
        return {}
    soft, hard = limits
    applied = {}
    for name in governed_tasks(app):
        task: Any = app.tasks[name]  # celery-types: limits are ints; Celery takes floats
        task.soft_time_limit = task.soft_time_limit or soft
        task.time_limit = task.time_limit or hard
        applied[name] = (float(task.soft_time_limit), float(task.time_limit))
    return applied


def overridden_settings(app: Celery, settings: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, the app's value, ours) for each setting the user set explicitly (its value is
    not Celery's default) that `settings` would replace by another value."""

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return list(a) == list(b)
        return bool(a == b)

    found = []
    for key, ours in settings.items():
        if key in _KEPT:
            continue
        theirs = app.conf.get(key)
        if not same(theirs, DEFAULTS.get(key)) and not same(theirs, ours):
            found.append((key, theirs, ours))
    return found


def worker_settings(
    app: Celery,
    config: GatewayConfig,
    *,
    calls_per_task: int = 1,
    extra_task_s: float = 60.0,
    visibility_margin_s: float = 300.0,
    consumer_timeout_s: float = RABBITMQ_CONSUMER_TIMEOUT_S,
) -> dict[str, Any]:
    """The settings `configure_worker` applies to `app`, computed without applying them.

    Reads `app`'s own time limits and transport options; changes nothing,
    registers nothing and connects nowhere (`polygate-celery check-config`).
    """
    if calls_per_task < 1:
        raise ConfigError("calls_per_task", "must be at least 1")
    soft, hard = governed_time_limits(app, config, calls_per_task, extra_task_s)
    transport = transport_options(app, hard, visibility_margin_s, consumer_timeout_s)[0]
    settings: dict[str, Any] = {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        # Celery's cancel on connection loss terminates late-acked runs so that their
        # redelivery does not run beside them. The run markers' heartbeat already keeps a
        # copy from running beside a live run, and the cancel loses tasks: one cancelled
        # before its body started is marked REVOKED, and its restored copy is discarded
        # as revoked. So runs go on, and their copies wait for them.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "broker_transport_options": transport,
        # A result that cannot be stored while Redis restarts would fail a task that
        # succeeded (Celery's "Task handler raised error"): retried instead.
        "result_backend_always_retry": True,
        # Publishes from a task (retries, chain steps, deferrals by countdown) ride out a
        # broker restart of some seconds (Celery's default gives up after ~0.6 s).
        "task_publish_retry_policy": PUBLISH_RETRY_POLICY,
    }
    if "worker_soft_shutdown_timeout" in DEFAULTS:  # Celery 5.5 and later
        settings["worker_soft_shutdown_timeout"] = min(60.0, soft)
    if "worker_eta_task_limit" in DEFAULTS:  # Celery 5.6 and later
        settings["worker_eta_task_limit"] = 1000
    return settings


def start_release_loop(app: Celery) -> Releaser | None:
    """Start this process's parking-lot release loop (once); None without Redis."""
    runtime = runtime_for(app)
    if runtime.state is None:
        return None
    with runtime.making:
        return _start_release_loop(app, runtime)


def _start_release_loop(app: Celery, runtime: WorkerRuntime) -> Releaser:
    if runtime.releaser is None:
        assert runtime.state is not None  # (start_release_loop checked)
        lot = runtime.state.lot(lot_name(app))
        releaser = Releaser(
            app, lot, runtime.config.deferral, probes=probe_intervals(runtime.config)
        )
        releaser.start(runtime.loop)
        runtime.releaser = releaser
        runtime.add_service(releaser)
        runtime.on_loop(_drain_legacy_lot(app, runtime))
    return runtime.releaser


async def _drain_legacy_lot(app: Celery, runtime: WorkerRuntime) -> None:
    """Release what an earlier version parked under the app's name alone
    (``parked:<main>``), until that lot is empty: a rolling upgrade loses no parked task."""
    assert runtime.state is not None
    legacy = runtime.state.lot(app.main or "default")
    releaser = Releaser(app, legacy, runtime.config.deferral, keep=False)  # no run names them
    interval = runtime.config.deferral.release_interval_s
    failed = 0
    while True:
        try:
            if not await legacy.size():
                return
            await releaser.release_due()
            failed = 0
        except Exception:
            failed += 1  # Redis or the broker away: the main release loop logs it
        await asyncio.sleep(releaser.backoff_s(failed) if failed else interval)


def check_eviction_policy(app: Celery) -> str | None:
    """Warn (and return the policy) when Redis could evict governance keys.

    Asks every server that holds governance keys: the one of `redis_url`, Sentinel's
    master, or each node of a Cluster (the first unsafe policy found is returned).
    Uses a short-lived client of its own, so that a prefork parent makes no runtime
    (no threads) before it forks its pool.
    """
    config = registered_config(app)
    if config is None or not config.store.shared:
        return None
    try:
        policies = eviction_policies(config.store)
    except Exception:
        return None  # CONFIG may be refused (managed Redis, ACLs): nothing to check
    unsafe = [p for p in policies if p not in SAFE_EVICTION]
    if unsafe:
        logger.warning(
            "Redis maxmemory-policy is %r: it may evict governance keys (permits, breakers, "
            "parked tasks); use noeviction",
            unsafe[0],
        )
        return unsafe[0]
    return policies[0] if policies else None


# Transport libraries that log every request at INFO ("HTTP Request: POST ...").
TRANSPORT_LOGGERS = ("httpx", "httpcore")


def quiet_transport_loggers() -> list[str]:
    """Set the transport libraries' loggers to WARNING in a worker, unless a level was
    set on them already (the user's logging config chose it); the names it set.

    A worker at INFO would otherwise log each provider request of each governed call,
    burying the lines that matter (a breaker opening, a task parked). The rule is the
    logger's own level: NOTSET (inheriting the root's) is quieted, any level set on it
    is the user's and kept; a user who wants the lines back sets ``httpx`` to INFO.
    """
    quieted = []
    for name in TRANSPORT_LOGGERS:
        transport = logging.getLogger(name)
        if transport.level == logging.NOTSET:
            transport.setLevel(logging.WARNING)
            quieted.append(name)
    return quieted


def _connect_signals(app: Celery) -> None:
    governance = governance_of(app)
    if governance.signals_connected:
        return
    governance.signals_connected = True

    def on_init(sender: Any = None, **_: Any) -> None:  # the worker's main process, pre-fork
        if getattr(sender, "app", app) is app:
            quiet_transport_loggers()
            apply_time_limits(app)
            install_counting_request(app.tasks)
            check_broker_unchanged(app)

    def on_process_init(**_: Any) -> None:  # prefork children
        start_release_loop(app)

    def on_ready(sender: Any = None, **_: Any) -> None:  # the worker's main process
        if getattr(sender, "app", app) is not app:
            return
        check_eviction_policy(app)
        pool = getattr(getattr(sender, "controller", None), "pool_cls", None)
        if "prefork" not in getattr(pool, "__module__", ""):
            start_release_loop(app)  # solo and threads pools run tasks in this process

    def on_process_shutdown(**_: Any) -> None:
        runtime_for(app).close()

    signals.worker_init.connect(on_init, weak=False)
    signals.worker_process_init.connect(on_process_init, weak=False)
    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_process_shutdown.connect(on_process_shutdown, weak=False)
