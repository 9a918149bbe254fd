"""Public exceptions of polygate_celery.

The tree::

    PolygateError
    ├── GatewayUnavailableError        scope-level: the work may succeed later → Celery defers
    │   ├── AllSourcesExhausted        .reason in {"stalled", "retry_exhausted", "fail_fast",
    │   │                              "deadline"}, .retry_after_s, .scope, .attempts,
    │   │                              .last_error, .trail
    │   └── GovernanceBackendError     the governance store is unreachable or answered nonsense
    │       ├── StoreUnreachable       no connection, a timeout, no master or slot yet
    │       └── StoreReplyError        a reply that cannot be read, a script's own error
    ├── SourceFatalError               request-level: bad request, content policy, no source
    │                                  left → never retried
    ├── DeferralBudgetExceeded         a Celery task deferred too often or too long → FAILURE,
    │                                  with the last verdict's last error
    └── ConfigError                    invalid configuration, raised at load time with the field

Every exception keeps all of its fields in ``args``, in constructor order, as
JSON-friendly values: Celery's JSON result backend rebuilds an exception as
``cls(*args)``, and pickling does the same. Messages carry classified reasons
only, never API keys, prompts or provider bodies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from polygate_celery.core.outcome import AttemptRecord

ExhaustedReason = Literal["stalled", "retry_exhausted", "fail_fast", "deadline"]
_REASONS = frozenset({"stalled", "retry_exhausted", "fail_fast", "deadline"})


def _trail(trail: Iterable[AttemptRecord | dict[str, Any]]) -> tuple[AttemptRecord, ...]:
    return tuple(AttemptRecord.from_value(r) for r in trail)


class PolygateError(Exception):
    """Base of every error polygate_celery raises on purpose."""


class GatewayUnavailableError(PolygateError):
    """The scope cannot serve now; the same work may succeed later."""


class AllSourcesExhausted(GatewayUnavailableError):
    """The governance loop gave up on a call, with a verdict.

    Attributes:
        reason: ``"stalled"`` (nothing in the scope made progress and this call
            spent its stall budget), ``"retry_exhausted"`` (the call spent
            `max_attempts` budget-burning attempts), ``"fail_fast"`` (nothing
            was runnable and the caller asked not to wait) or ``"deadline"``
            (the call hit `max_call_s`).
        scope: The call's scope.
        retry_after_s: When the scope is expected to take work again, in seconds.
        attempts: Attempts the call made.
        last_error: The last failed attempt's classified error, if any.
        trail: Every attempt, as `AttemptRecord`s.
        rate_limited: `retry_after_s` is not an estimate but when rate limits
            reset (every source was paused by a provider's Retry-After or
            waited for its quota).
        starved_class: The call's priority class, when it stalled while the scope
            served other classes (its class made no progress, the scope did: SPEC
            §8); None for any other verdict, an outage's stall included.
        capped_tenant: The call's tenant, when it stalled held back by its tenant's own
            caps alone (SPEC §8): the scope is not out; None otherwise.
    """

    def __init__(
        self,
        reason: ExhaustedReason,
        scope: str,
        retry_after_s: float,
        attempts: int = 0,
        last_error: str | None = None,
        trail: Sequence[AttemptRecord | dict[str, Any]] = (),
        rate_limited: bool = False,
        starved_class: str | None = None,
        capped_tenant: str | None = None,
    ) -> None:
        if reason not in _REASONS:
            raise ValueError(f"unknown AllSourcesExhausted reason {reason!r}")
        self.reason: ExhaustedReason = reason
        self.scope = scope
        self.retry_after_s = float(retry_after_s)
        self.attempts = int(attempts)
        self.last_error = last_error
        self.trail = _trail(trail)
        self.rate_limited = bool(rate_limited)
        self.starved_class = starved_class
        self.capped_tenant = capped_tenant
        super().__init__(
            reason,
            scope,
            self.retry_after_s,
            self.attempts,
            last_error,
            [r.as_dict() for r in self.trail],
            self.rate_limited,
        )

    def __str__(self) -> str:
        text = (
            f"scope {self.scope!r}: {self.reason} after {self.attempts} attempt(s); "
            f"retry after {self.retry_after_s:.3g} s"
        )
        if self.last_error:
            text += f"; last error: {self.last_error}"
        return text


class GovernanceBackendError(GatewayUnavailableError):
    """The governance store could not answer; no request was sent (fail closed).

    Attributes:
        message: What failed (an address, never a password).
        scope: The call's scope, when one was known.
    """

    def __init__(self, message: str, scope: str | None = None) -> None:
        self.message = message
        self.scope = scope
        super().__init__(message, scope)

    def __str__(self) -> str:
        prefix = f"scope {self.scope!r}: " if self.scope else ""
        return f"{prefix}governance store unavailable: {self.message}"


class StoreUnreachable(GovernanceBackendError):
    """The governance store could not be reached or did not answer in time.

    A refused or reset connection, a timeout, a server still loading its data,
    Sentinel knowing no master, a cluster with a slot uncovered or down, a
    replica that no longer takes writes after a failover. Waiting may mend it:
    the same client reconnects when Redis is back.

    Attributes:
        message: What failed (an address, never a password).
        scope: The call's scope, when one was known.
    """


class StoreReplyError(GovernanceBackendError):
    """The governance store answered, but not with anything the store layer can use.

    A reply of the wrong shape, an error a script raised, a key of the wrong
    type, a server out of memory: waiting for the connection would not mend it.

    Attributes:
        message: What failed, with the reply when it is short of secrets.
        scope: The call's scope, when one was known.
    """


class SourceFatalError(PolygateError):
    """The request itself cannot be served: retrying it anywhere would not help.

    A bad request, a content-policy refusal, or a request every source rejected.

    Attributes:
        reason: The classified reason (never the provider's body, unless
            `include_bodies` is on).
        scope: The call's scope.
        source: The source that answered so, if one did.
        status: Its HTTP status, if it answered.
        trail: Every attempt, as `AttemptRecord`s.
    """

    def __init__(
        self,
        reason: str,
        scope: str,
        source: str | None = None,
        status: int | None = None,
        trail: Sequence[AttemptRecord | dict[str, Any]] = (),
    ) -> None:
        self.reason = reason
        self.scope = scope
        self.source = source
        self.status = status
        self.trail = _trail(trail)
        super().__init__(reason, scope, source, status, [r.as_dict() for r in self.trail])

    @property
    def attempts(self) -> int:
        return len(self.trail)

    def __str__(self) -> str:
        where = f" from source {self.source!r}" if self.source else ""
        status = f" (HTTP {self.status})" if self.status is not None else ""
        return f"scope {self.scope!r}: fatal{where}{status}: {self.reason}"


class DeferralBudgetExceeded(PolygateError):
    """A Celery task's scope stayed unavailable past `max_deferrals` or `max_defer_age_s`.

    A FAILURE says what the provider did, not only that the scope stalled.

    Attributes:
        reason: The last verdict, which would have deferred the task again
            (``backend_error`` when the store could not answer).
        scope: Its scope, when one was known.
        deferrals: The task's deferrals.
        age_s: Seconds since its first deferral.
        retry_after_s: The last verdict's estimate.
        last_error: The last verdict's last error
            (``"vllm: transient: connection refused"``).
        source: The last failed attempt's source.
        status: The last failed attempt's HTTP status.
    """

    def __init__(
        self,
        reason: str,
        scope: str | None,
        deferrals: int,
        age_s: float,
        retry_after_s: float | None = None,
        last_error: str | None = None,
        source: str | None = None,
        status: int | None = None,
    ) -> None:
        self.reason = reason
        self.scope = scope
        self.deferrals = int(deferrals)
        self.age_s = float(age_s)
        self.retry_after_s = retry_after_s
        self.last_error = last_error
        self.source = source
        self.status = None if status is None else int(status)
        super().__init__(
            reason,
            scope,
            self.deferrals,
            self.age_s,
            retry_after_s,
            last_error,
            source,
            self.status,
        )

    @classmethod
    def after(
        cls, verdict: GatewayUnavailableError, deferrals: int, age_s: float
    ) -> DeferralBudgetExceeded:
        """The failure of a task whose budget `verdict` found spent: it carries the verdict's
        reason, scope, estimate and last error (a store that could not answer is one)."""
        if isinstance(verdict, AllSourcesExhausted):
            failed = [r for r in verdict.trail if r.outcome != "success"]
            last = failed[-1] if failed else None
            return cls(
                verdict.reason,
                verdict.scope,
                deferrals,
                age_s,
                verdict.retry_after_s,
                verdict.last_error,
                last.source if last else None,
                last.status if last else None,
            )
        scope = getattr(verdict, "scope", None)
        return cls("backend_error", scope, deferrals, age_s, 1.0, str(verdict))

    def __str__(self) -> str:
        where = f"scope {self.scope!r}: " if self.scope else ""
        text = (
            f"{where}deferral budget spent after {self.deferrals} deferral(s) over "
            f"{self.age_s:.0f} s; last verdict: {self.reason}"
        )
        if self.last_error:
            text += f"; last error: {self.last_error}"
        return text


class ConfigError(PolygateError):
    """Invalid configuration, raised at load time.

    Input values are never echoed, since a bad value may be a secret.

    Attributes:
        field: The dotted path of the first bad setting (``scopes.summarise.max_attempts``).
        message: What is wrong with it.
        problems: Every ``(path, message)`` found.
    """

    def __init__(self, field: str, message: str, problems: Sequence[Sequence[str]] = ()) -> None:
        self.field = field
        self.message = message
        self.problems: tuple[tuple[str, str], ...] = tuple(
            (str(p[0]), str(p[1])) for p in (problems or [(field, message)])
        )
        super().__init__(field, message, [list(p) for p in self.problems])

    def __str__(self) -> str:
        lines = [f"{path}: {msg}" for path, msg in self.problems]
        if len(lines) == 1:
            return f"invalid configuration: {lines[0]}"
        return "invalid configuration:\n  " + "\n  ".join(lines)


class PoisonMessage(PolygateError):
    """A task message whose every run lost its worker: failed instead of redelivered again."""

    def __init__(self, task_id: str, redeliveries: int) -> None:
        self.task_id = task_id
        self.redeliveries = redeliveries
        super().__init__(task_id, redeliveries)

    def __str__(self) -> str:
        return (
            f"task {self.task_id} was redelivered more than {self.redeliveries} times "
            "(its worker lost, or its retry not taken by the broker, each time)"
        )
