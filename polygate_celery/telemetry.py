"""Telemetry: frozen event objects and the hook protocol that receives them.

Telemetry never decides: a hook that raises is logged and dropped, and never
changes a verdict or raises into the call (SPEC §3 rule 10). Hooks are plain
synchronous callables so a Prometheus counter or a structured logger fits as is.

The events of one call carry its `call_id`, and a `CallEvent` opens it, so a hook
can follow a call from its start to its verdict (a tracing hook makes a span of
it). Each is called in the call's own context (`contextvars`): a hook may read
the current trace context there. `RunTrace` is how a task run and its calls'
hooks exchange trace context: what the run's message carries in, what a
deferral carries on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from polygate_celery.core.outcome import AttemptRecord, Outcome
from polygate_celery.core.selection import BlockReason

logger = logging.getLogger("polygate_celery")


@dataclass(frozen=True, slots=True)
class CallEvent:
    """A call began in `scope`, of `kind` ("chat", "embedding" or "ocr").

    `payload` is the request as given: it holds the prompt, so a hook records it
    only where its user asked for bodies (it is left out of the event's repr).
    `priority` is the call's class (the default class when it named none; None when
    the configuration declares no class), `tenant` whom it is for (None: no one).
    """

    scope: str
    call_id: str
    kind: str
    payload: Any = field(default=None, repr=False, compare=False)
    priority: str | None = field(default=None, compare=False)
    tenant: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class AttemptEvent:
    """An attempt ended: the `attempt`-th of its call, as recorded in the call's trail.

    `model` is the model the source is configured to ask for; `server` the
    source's origin (scheme, host and port of its base URL, never its user,
    password, path or query); `outcome` the adapter's classified answer (its
    `value` holds the answer itself, left out of the event's repr).
    """

    scope: str
    attempt: int
    record: AttemptRecord
    call_id: str | None = field(default=None, compare=False)
    model: str | None = field(default=None, compare=False)
    server: str | None = field(default=None, compare=False)
    outcome: Outcome | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class WaitEvent:
    """The call waited: for a runnable source (`no_runnable`) or after a failure (`backoff`)."""

    scope: str
    cause: Literal["no_runnable", "backoff"]
    started_s: float
    seconds: float
    blocked: tuple[tuple[str, BlockReason], ...] = ()
    call_id: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class VerdictEvent:
    """A call ended: `verdict` is "success", "fatal", an `AllSourcesExhausted` reason,
    "backend_error", "cancelled", or "error" (an unexpected exception). `priority` and
    `tenant` are the call's, as in its `CallEvent`."""

    scope: str
    verdict: str
    attempts: int
    elapsed_s: float
    stalled_s: float
    retry_after_s: float | None = None
    source: str | None = None
    call_id: str | None = field(default=None, compare=False)
    priority: str | None = field(default=None, compare=False)
    tenant: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class SourceAlertEvent:
    """Something an operator must see: e.g. a source's credentials were rejected."""

    source: str
    reason: str
    paused_for_s: float


@dataclass(frozen=True, slots=True)
class DeferralEvent:
    """A Celery task was deferred: re-enqueued to run again after `delay_s`.

    `reason` is the verdict's (an `AllSourcesExhausted` reason, or
    "backend_error" when the store could not answer); `deferrals` counts this
    one; `strategy` is how it waits ("park" or "countdown").
    """

    scope: str | None
    reason: str
    deferrals: int
    delay_s: float
    strategy: str
    retry_after_s: float | None = None


Event: TypeAlias = (
    CallEvent | AttemptEvent | WaitEvent | VerdictEvent | SourceAlertEvent | DeferralEvent
)
TelemetryHook: TypeAlias = Callable[[Event], None]


@runtime_checkable
class CountsByTenant(Protocol):
    """A hook that labels what it counts with the tenants the configuration declares, and
    no other (`PrometheusHook`): `configure_worker` tells it which those are."""

    def declare_tenants(self, tenants: Collection[str]) -> None: ...


class Telemetry:
    """Fans events out to hooks; a failing hook is logged and dropped."""

    def __init__(self, hooks: Sequence[TelemetryHook] = ()) -> None:
        self._hooks = tuple(hooks)

    @property
    def active(self) -> bool:
        """Whether anyone listens: callers skip building events when nobody does."""
        return bool(self._hooks)

    def emit(self, event: Event) -> None:
        for hook in self._hooks:
            try:
                hook(event)
            except Exception:
                logger.warning("telemetry hook %r failed; event dropped", hook, exc_info=True)


@dataclass(slots=True)
class RunTrace:
    """Trace context a Celery task run shares with the hooks of its governed calls.

    Set for the run (`run_trace`) only when hooks listen. `previous` is the W3C
    trace context (``traceparent``, ``tracestate``) of the call that ended the
    task's previous run, which its deferred message carried; `deferrals` how
    many times the task was deferred before this run. A tracing hook sets
    `latest` to the trace context of the run's latest call, which a deferral
    carries on to the next run.
    """

    previous: Mapping[str, str] | None = None
    deferrals: int = 0
    latest: dict[str, str] | None = None


run_trace: ContextVar[RunTrace | None] = ContextVar("polygate_run_trace", default=None)
