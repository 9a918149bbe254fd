"""Telemetry: frozen event objects and the hook protocol that receives them.

Telemetry never decides: a hook that raises is logged and dropped, and never
changes a verdict or raises into the call (SPEC §3 rule 10). Hooks are plain
synchronous callables so a Prometheus counter or a structured logger fits as is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from polygate_celery.core.outcome import AttemptRecord
from polygate_celery.store.base import BlockReason

logger = logging.getLogger("polygate_celery")


@dataclass(frozen=True, slots=True)
class AttemptEvent:
    """An attempt ended: the `attempt`-th of its call, as recorded in the call's trail."""

    scope: str
    attempt: int
    record: AttemptRecord


@dataclass(frozen=True, slots=True)
class WaitEvent:
    """The call waited: for a runnable source (`no_runnable`) or after a failure (`backoff`)."""

    scope: str
    cause: Literal["no_runnable", "backoff"]
    started_s: float
    seconds: float
    blocked: tuple[tuple[str, BlockReason], ...] = ()


@dataclass(frozen=True, slots=True)
class VerdictEvent:
    """A call ended: `verdict` is "success", "fatal" or an `AllSourcesExhausted` reason."""

    scope: str
    verdict: str
    attempts: int
    elapsed_s: float
    stalled_s: float
    retry_after_s: float | None = None
    source: str | None = None


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


Event: TypeAlias = AttemptEvent | WaitEvent | VerdictEvent | SourceAlertEvent | DeferralEvent
TelemetryHook: TypeAlias = Callable[[Event], None]


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
