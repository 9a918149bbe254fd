"""Decision core: the per-source circuit breaker, as pure transitions on immutable state.

closed → open after `failure_threshold` consecutive transient failures; open →
half-open once the cooldown has passed, admitting exactly one probe; the probe's
success closes it, its failure opens it again. A 429, a rejected or a fatal
request says nothing about the source's health and leaves the count alone.
Rejected credentials open it for the long `auth_cooldown_s`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Literal

from polygate_celery.core.outcome import OutcomeKind
from polygate_celery.core.terms import BreakerTerms

BreakerMode = Literal["closed", "open", "half_open"]


class Effect(enum.Enum):
    """What a settled attempt says about its source's health."""

    SUCCESS = "success"
    FAILURE = "failure"
    AUTH_FAILURE = "auth_failure"
    NEUTRAL = "neutral"


@dataclass(frozen=True, slots=True)
class BreakerState:
    mode: BreakerMode = "closed"
    failures: int = 0
    open_until: float = 0.0
    probe: str | None = None


def breaker_admit(state: BreakerState, now: float, permit_id: str) -> BreakerState | None:
    """The state after admitting `permit_id`, or None if the breaker refuses it."""
    if state.mode == "closed":
        return state
    if state.mode == "open":
        if now < state.open_until:
            return None
        return replace(state, mode="half_open", probe=permit_id)
    if state.probe is None:
        return replace(state, probe=permit_id)
    return None


def breaker_reopens_at(state: BreakerState, now: float) -> float | None:
    """When a refusing breaker will admit again, if that is known."""
    if state.mode == "open" and now < state.open_until:
        return state.open_until
    return None


def breaker_settle(
    state: BreakerState, terms: BreakerTerms, now: float, permit_id: str, effect: Effect
) -> BreakerState:
    """The state after the attempt holding `permit_id` ended with `effect`."""
    is_probe = state.probe == permit_id
    if effect is Effect.SUCCESS:
        return BreakerState()
    if effect is Effect.AUTH_FAILURE:
        until = max(state.open_until, now + terms.auth_cooldown_s)
        return BreakerState(mode="open", failures=state.failures, open_until=until)
    if effect is Effect.FAILURE:
        if is_probe:
            return BreakerState(
                mode="open", failures=state.failures, open_until=now + terms.cooldown_s
            )
        if state.mode != "closed":
            return state
        failures = state.failures + 1
        if failures >= terms.failure_threshold:
            return BreakerState(mode="open", failures=failures, open_until=now + terms.cooldown_s)
        return replace(state, failures=failures)
    # NEUTRAL: a probe that proved nothing frees the probe slot for the next caller.
    return replace(state, probe=None) if is_probe else state


def effect_of(kind: OutcomeKind, credentials_rejected: bool = False) -> Effect:
    """What an attempt's outcome says about its source's health."""
    if kind is OutcomeKind.SUCCESS:
        return Effect.SUCCESS
    if kind is OutcomeKind.TRANSIENT:
        return Effect.FAILURE
    if kind is OutcomeKind.REJECTED and credentials_rejected:
        return Effect.AUTH_FAILURE
    return Effect.NEUTRAL
