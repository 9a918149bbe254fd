"""Celery edge: one governance runtime per worker process, made on first use after fork.

A runtime owns an event loop running in a daemon thread, and the gateway, the
store and the HTTP clients that live on that loop. Task bodies (any pool:
prefork, solo, threads) hand coroutines to it and block for the answer, so
there is exactly one loop per process and no "attached to a different loop"
across tasks. A process made by fork starts without its parent's runtime.

When the waiting task is interrupted (a soft time limit, a revoke), the call
on the loop is cancelled and waited for, so its permits are released before the
task's exception goes on, and the loop stays usable by the next task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random as _random
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from celery import Celery

from polygate_celery.celery.app_state import RuntimeParts, governance_of
from polygate_celery.celery.state import CeleryState, RedisCeleryState
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.loading import CONFIG_PATH_ENV, load_config
from polygate_celery.errors import ConfigError
from polygate_celery.governance.gateway import Gateway
from polygate_celery.sources.factory import sources_from_config
from polygate_celery.store.factory import store_from_config
from polygate_celery.store.redis import RedisStore, blocking_governance_client
from polygate_celery.telemetry import CountsByTenant, Telemetry, TelemetryHook

if TYPE_CHECKING:
    from polygate_celery.celery.guard import Heartbeat
    from polygate_celery.celery.parking import Releaser

__all__ = [
    "RuntimeParts",
    "WorkerRuntime",
    "forget_config",
    "governed_config",
    "register_config",
    "registered_config",
    "reset_runtime",
    "runtime_for",
    "set_runtime_parts",
    "unknown_scope",
]

logger = logging.getLogger("polygate_celery")
T = TypeVar("T")
CANCEL_WAIT_S = 10.0
REGISTERED = "the configuration configure_worker registered"
DEFAULT_FILE = "polygate.toml"  # what the CLI reads by default, and a worker does not


def governed_config(config: GatewayConfig) -> GatewayConfig:
    """`config` as governed tasks run it (`GatewayConfig.for_governed_tasks`)."""
    return config.for_governed_tasks()


def set_runtime_parts(app: Celery, parts: RuntimeParts | None) -> None:
    """Build `app`'s runtimes in this process with `parts` from now on (None: as the
    configuration says); the current runtime, if any, is closed first."""
    reset_runtime(app)
    governance_of(app).parts = parts


def register_config(
    app: Celery, config: GatewayConfig, hooks: Sequence[TelemetryHook] = ()
) -> None:
    """The configuration governed tasks of `app` use (else: `load_config()` on first use),
    and the telemetry hooks its runtimes pass every event to; a hook that counts by tenant
    learns the tenants `config` declares."""
    governance = governance_of(app)
    governance.config, governance.hooks = config, tuple(hooks)
    for hook in hooks:
        if isinstance(hook, CountsByTenant):
            hook.declare_tenants(config.tenants)


def forget_config(app: Celery) -> None:
    """Undo `register_config` (tests)."""
    governance = governance_of(app)
    governance.config, governance.hooks = None, ()


def registered_config(app: Celery) -> GatewayConfig | None:
    """The configuration `configure_worker` registered for `app`, if any."""
    return governance_of(app).config


def runtime_for(app: Celery) -> WorkerRuntime:
    """This process's runtime for `app`, made on first use (and anew after a fork)."""
    governance = governance_of(app)
    with governance.lock:
        runtime = governance.own_runtime()
        if runtime is None:
            config = governance.config
            origin: str | None = REGISTERED
            if config is None:
                path = os.environ.get(CONFIG_PATH_ENV) or None
                config = load_config(path)
                origin = f"{path} (${CONFIG_PATH_ENV})" if path else None
            runtime = WorkerRuntime(
                app, config, hooks=governance.hooks, parts=governance.parts, origin=origin
            )
            governance.runtime = runtime
        return runtime


def unknown_scope(
    app: Celery, config: GatewayConfig, origin: str | None, scope: str
) -> ConfigError:
    """The error of a governed call in `scope`, which `config` lacks: where the configuration
    came from (`origin`; None: ``POLYGATE_*`` variables alone, no file). When nothing was
    loaded at all, it says so, and where the worker looked, rather than naming the scope
    alone (the usual cause: ``configure_worker`` forgotten and ``$POLYGATE_CONFIG`` unset)."""
    field = f"scopes.{scope}"
    if origin is None and not config.scopes and not config.sources:
        found = os.path.abspath(DEFAULT_FILE)
        beside = (
            f"; {found} exists, but workers read no file by default: set {CONFIG_PATH_ENV}={found}"
            if os.path.isfile(found)
            else ""
        )
        return ConfigError(
            field,
            f"no configuration was loaded, so there is no scope {scope!r}: "
            f"configure_worker(app, config) was not called for app {app.main!r}, "
            f"${CONFIG_PATH_ENV} is unset in this worker, and no POLYGATE_* variable "
            f"sets a scope or a source{beside}",
        )
    configured = ", ".join(sorted(config.scopes)) or "none"
    where = origin or "the POLYGATE_* variables (no file: $POLYGATE_CONFIG is unset)"
    return ConfigError(field, f"no scope named {scope!r} in {where} (configured: {configured})")


def reset_runtime(app: Celery) -> None:
    """Close and forget this process's runtime for `app` (a new one is made on next use)."""
    governance = governance_of(app)
    with governance.lock:
        runtime, governance.runtime = governance.own_runtime(), None
    if runtime is not None:
        runtime.close()


class WorkerRuntime:
    """The event loop, gateway and store of one worker process.

    `hooks` receive the gateway's events (on the loop's thread) and the
    deferrals of this process's tasks (on the task's thread). `origin` says
    where `config` came from, for errors (None: the environment alone).
    """

    def __init__(
        self,
        app: Celery,
        config: GatewayConfig,
        *,
        hooks: Sequence[TelemetryHook] = (),
        parts: RuntimeParts | None = None,
        origin: str | None = REGISTERED,
    ) -> None:
        self.app = app
        config = governed_config(config)
        self.config = config
        self.origin = origin
        self.telemetry = Telemetry(hooks)
        self.pid = os.getpid()
        parts = parts or RuntimeParts()
        # Store and gateway first: one that cannot be built leaves no loop thread behind
        # (each task would otherwise start one more).
        self.store = parts.store or store_from_config(config.store, parts.clock, groups_of=config)
        sources = {**sources_from_config(config), **parts.sources} if parts.sources else None
        self.gateway = Gateway(
            config,
            sources,
            store=self.store,
            clock=parts.clock,
            random=parts.random,
            hooks=hooks,
            scope_gate=True,
            caller="task",  # a task parks: an outage's failures are waiting (rule 15)
        )
        # Deferral times travel in messages to other workers: seconds since the epoch.
        self.wall_time: Callable[[], float] = time.time
        self.random: Callable[[], float] = parts.random or _random.random
        self.redis = self.store.client if isinstance(self.store, RedisStore) else None
        # The parking lots and run markers: beside a Redis store only (a worker without
        # one defers by countdown, and runs every copy it gets).
        self.state: CeleryState | None = None
        if isinstance(self.store, RedisStore):
            self.state = RedisCeleryState(self.store.client, self.store.keys, self._blocking_client)
        # scope -> when this process last woke its parked tasks (`handle._wake_parked`)
        self.woken_at: dict[str, float] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="polygate-loop", daemon=True
        )
        self._thread.start()
        self._blocking: Any = None
        self._made = threading.Lock()
        self._services: list[Any] = []
        # This process's release loop (`worker.start_release_loop`) and run heartbeat
        # (`guard.heartbeat_of`), made on first use and stopped with the runtime.
        self.releaser: Releaser | None = None
        self.heartbeat: Heartbeat | None = None
        self.making = threading.Lock()  # held while one of them is made

    def _blocking_client(self) -> Any:
        return self.blocking_redis

    @property
    def blocking_redis(self) -> Any:
        """A blocking client of the same Redis, for steps a task's own thread takes (run
        markers), made on first use; None without a Redis store."""
        if self._blocking is None and self.redis is not None:
            with self._made:
                if self._blocking is None:
                    self._blocking = blocking_governance_client(self.config.store)
        return self._blocking

    def check_scope(self, scope: str) -> str:
        """`scope`, if the configuration has it; else the `ConfigError` that says where the
        configuration came from (or that none was loaded)."""
        if scope not in self.config.scopes:
            raise unknown_scope(self.app, self.config, self.origin, scope)
        return scope

    @property
    def keys(self) -> Any:
        return self.store.keys if isinstance(self.store, RedisStore) else None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and wait for it, from a task's thread.

        If the wait is interrupted (SoftTimeLimitExceeded, a revoke, SystemExit),
        the coroutine is cancelled and awaited before the interruption goes on.
        """
        started, finished = threading.Event(), threading.Event()

        async def guarded() -> T:
            started.set()
            try:
                return await coroutine
            finally:
                finished.set()

        future = asyncio.run_coroutine_threadsafe(guarded(), self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise
        except BaseException:
            if not future.done():
                self.loop.call_soon_threadsafe(future.cancel)
                # A call cancelled before its first step never runs: nothing to wait for.
                if started.is_set() and not finished.wait(CANCEL_WAIT_S):
                    logger.warning("a cancelled governed call did not end in %gs", CANCEL_WAIT_S)
            raise

    def on_loop(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coroutine` on the loop without waiting (background work)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def add_service(self, service: Any) -> None:
        """Something to stop with the runtime (a release loop)."""
        self._services.append(service)

    def close(self) -> None:
        for service in self._services:
            service.stop()
        try:
            self.run(self._aclose())
        finally:
            if self._blocking is not None:
                self._blocking.close()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self.loop.close()

    async def _aclose(self) -> None:
        from polygate_celery.sources.http import close_http_client  # noqa: PLC0415

        await self.gateway.aclose()
        await close_http_client()
        if isinstance(self.store, RedisStore):
            await self.store.aclose()
