"""Celery edge: everything governance keeps for one Celery app, in one object found from the app.

`configure_worker` and the governed tasks of an app share one `AppGovernance`:
the configuration and telemetry hooks it registered, the parts a test builds
runtimes with, the time limits it derived, the broker it configured for, and
this process's `WorkerRuntime` (which owns the release loop and the run
heartbeat of the process). It lives on the app instance itself, under the one
attribute `ATTRIBUTE` (Celery keeps no extension registry of its own; the app
is the object every task, signal and worker hands us), so two apps never share
state and nothing outlives its app. A process made by fork inherits the object
but not its runtime: the runtime remembers the pid that made it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celery import Celery

from polygate_celery.clock import Clock
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.sources.base import Source
from polygate_celery.store.base import Store
from polygate_celery.telemetry import TelemetryHook

if TYPE_CHECKING:
    from polygate_celery.celery.runtime import WorkerRuntime

ATTRIBUTE = "polygate_governance"
"""The attribute of a Celery app that holds its `AppGovernance`."""


@dataclass(frozen=True, slots=True)
class RuntimeParts:
    """What a runtime is built with instead of what the configuration describes (tests):
    `sources` by source name (the others stay the configuration's), a `clock` (a
    `VirtualClock`), a `store`, and the jitter's `random`."""

    sources: Mapping[str, Source] = field(default_factory=dict)
    clock: Clock | None = None
    store: Store | None = None
    random: Callable[[], float] | None = None


@dataclass(frozen=True, slots=True)
class BrokerSeen:
    """The transports `configure_worker` configured an app for, and the RabbitMQ consumer
    timeout it was told."""

    kinds: frozenset[str]
    consumer_timeout_s: float


class AppGovernance:
    """One Celery app's governance: what `configure_worker` registered, and this process's
    runtime. Made on first use by `governance_of`."""

    def __init__(self) -> None:
        self.config: GatewayConfig | None = None  # None: `load_config()` at first use
        self.hooks: tuple[TelemetryHook, ...] = ()
        self.parts: RuntimeParts | None = None
        self.limits: tuple[float, float] | None = None  # (soft, hard) of governed tasks
        self.broker: BrokerSeen | None = None
        self.signals_connected = False
        self.runtime: WorkerRuntime | None = None  # this process's, if made
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    @property
    def lock(self) -> threading.Lock:
        """Serialises making and dropping the runtime. A lock inherited through a fork
        may be held by a thread the child does not have: the child makes its own."""
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    def own_runtime(self) -> WorkerRuntime | None:
        """This process's runtime, if one was made here (not one inherited by fork)."""
        runtime = self.runtime
        return runtime if runtime is not None and runtime.pid == os.getpid() else None


def governance_of(app: Celery) -> AppGovernance:
    """`app`'s governance, made (empty) on first use."""
    found = vars(app).get(ATTRIBUTE)
    if isinstance(found, AppGovernance):
        return found
    with _making:
        found = vars(app).get(ATTRIBUTE)
        if not isinstance(found, AppGovernance):
            found = AppGovernance()
            setattr(app, ATTRIBUTE, found)
        return found


_making = threading.Lock()  # held only while an app's (empty) governance is attached


def _new_making_lock() -> None:
    global _making  # noqa: PLW0603 - a lock held at fork time would never be released here
    _making = threading.Lock()


os.register_at_fork(after_in_child=_new_making_lock)
