"""Testing: run a Celery app's governed tasks in this process, against scripted sources and
virtual time, as a user's own tests do (needs the ``celery`` extra).

    with governed_tasks(app, config, {"vllm": ScriptedSource(clock, [steps.ok("hi")])},
                        clock=clock):
        assert summarise.delay("doc").get() == "hi"     # eager: runs here, at once

Inside, the app runs eagerly (``task_always_eager``, errors propagated): a verdict that
would defer the task in a worker is raised instead (`AllSourcesExhausted` with a note
saying so), a failure is raised as it is. Sources not given keep the configuration's
adapters; the store is in memory on `clock` unless one is given. On leaving, the app's
settings, configuration and runtime are as they were (the runtime's thread is stopped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from celery import Celery

from polygate_celery.celery.runtime import (
    RuntimeParts,
    WorkerRuntime,
    forget_config,
    register_config,
    registered_config,
    reset_runtime,
    runtime_for,
    set_runtime_parts,
)
from polygate_celery.clock import Clock
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.sources.base import Source
from polygate_celery.store.base import Store
from polygate_celery.store.memory import MemoryStore
from polygate_celery.telemetry import TelemetryHook

EAGER = ("task_always_eager", "task_eager_propagates")


@contextmanager
def governed_tasks(
    app: Celery,
    config: GatewayConfig,
    sources: Mapping[str, Source] | None = None,
    *,
    clock: Clock | None = None,
    store: Store | None = None,
    random: Callable[[], float] | None = None,
    eager: bool = True,
    hooks: Sequence[TelemetryHook] = (),
) -> Iterator[WorkerRuntime]:
    """Run `app`'s governed tasks in this process, as a test of them does.

    On leaving, the app's settings, configuration and runtime are as they were.

    Args:
        app: The Celery app.
        config: The configuration its tasks run with.
        sources: Adapters by source name (e.g. `ScriptedSource`s); the others
            keep the configuration's adapters.
        clock: The clock (a `VirtualClock` for virtual time).
        store: Default: an in-memory store on `clock`.
        random: Jitter's draws. Default with a clock: always 0.0, so runs repeat.
        eager: Run tasks eagerly, errors propagated (a verdict that would defer
            the task in a worker is raised instead). False leaves the app's
            settings alone (a worker started in this process, e.g. Celery's
            `start_worker`, then runs them).
        hooks: Telemetry hooks given every event of the tasks' calls (e.g. to see
            each call's priority class and tenant in its `CallEvent`).

    Yields:
        The worker runtime (its `gateway` and `store` can be inspected).
    """
    saved_config = registered_config(app)
    saved_conf = {key: app.conf[key] for key in EAGER}
    if random is None and clock is not None:
        random = _no_jitter
    parts = RuntimeParts(
        sources=dict(sources or {}),
        clock=clock,
        store=store if store is not None else MemoryStore(clock),
        random=random,
    )
    register_config(app, config, hooks)
    set_runtime_parts(app, parts)
    if eager:
        app.conf.update(task_always_eager=True, task_eager_propagates=True)
    try:
        yield runtime_for(app)
    finally:
        set_runtime_parts(app, None)  # stops the runtime's thread
        app.conf.update(saved_conf)
        if saved_config is not None:
            register_config(app, saved_config)
        else:
            forget_config(app)


def _no_jitter() -> float:
    return 0.0


__all__ = ["governed_tasks", "reset_runtime"]
