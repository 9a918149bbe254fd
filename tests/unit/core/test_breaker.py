"""The per-source circuit breaker as pure transitions (SPEC §2, §3 rule 3, defaults)."""

from __future__ import annotations

import pytest

from polygate_celery.config.models import BreakerConfig
from polygate_celery.core.breaker import (
    BreakerState,
    Effect,
    breaker_admit,
    breaker_reopens_at,
    breaker_settle,
    effect_of,
)
from polygate_celery.core.outcome import OutcomeKind
from polygate_celery.core.terms import BreakerTerms

TERMS = BreakerTerms(failure_threshold=3, cooldown_s=30.0, auth_cooldown_s=600.0)


def settle_many(state: BreakerState, effects: list[Effect], now: float = 0.0) -> BreakerState:
    for i, effect in enumerate(effects):
        state = breaker_settle(state, TERMS, now, f"p{i}", effect)
    return state


def open_at(now: float) -> BreakerState:
    state = settle_many(BreakerState(), [Effect.FAILURE] * TERMS.failure_threshold, now)
    assert state.mode == "open"
    return state


def test_defaults_match_the_configuration() -> None:
    assert BreakerTerms() == BreakerTerms(failure_threshold=5, cooldown_s=10.0)
    configured = BreakerConfig()
    assert BreakerTerms() == BreakerTerms(
        configured.failure_threshold, configured.cooldown_s, configured.auth_cooldown_s
    )
    assert BreakerState().mode == "closed"


def test_closed_breaker_admits_everyone() -> None:
    state = BreakerState()
    assert breaker_admit(state, 0.0, "p1") == state
    assert breaker_reopens_at(state, 0.0) is None


def test_opens_after_threshold_consecutive_failures() -> None:
    state = settle_many(BreakerState(), [Effect.FAILURE] * 2, now=100.0)
    assert state.mode == "closed"
    assert state.failures == 2
    state = breaker_settle(state, TERMS, 100.0, "p", Effect.FAILURE)
    assert state.mode == "open"
    assert state.open_until == 130.0


def test_success_resets_the_count() -> None:
    state = settle_many(BreakerState(), [Effect.FAILURE, Effect.FAILURE, Effect.SUCCESS])
    assert state == BreakerState()
    state = settle_many(state, [Effect.FAILURE, Effect.FAILURE])
    assert state.mode == "closed"


def test_neutral_neither_counts_nor_resets() -> None:
    state = settle_many(BreakerState(), [Effect.FAILURE, Effect.FAILURE])
    for _ in range(10):
        state = breaker_settle(state, TERMS, 0.0, "n", Effect.NEUTRAL)
    assert state.mode == "closed"
    assert state.failures == 2
    state = breaker_settle(state, TERMS, 0.0, "p", Effect.FAILURE)
    assert state.mode == "open"


def test_open_refuses_until_open_until() -> None:
    state = open_at(100.0)
    assert breaker_admit(state, 100.0, "a") is None
    assert breaker_admit(state, 129.999, "a") is None
    assert breaker_reopens_at(state, 110.0) == 130.0


def test_open_admits_exactly_one_half_open_probe_after_cooldown() -> None:
    state = open_at(100.0)
    probing = breaker_admit(state, 130.0, "probe")
    assert probing is not None
    assert probing.mode == "half_open"
    assert probing.probe == "probe"
    assert breaker_admit(probing, 130.0, "other") is None
    assert breaker_admit(probing, 999.0, "other") is None
    # Not known when a half-open breaker admits again: it depends on the probe.
    assert breaker_reopens_at(probing, 130.0) is None


def test_probe_success_closes() -> None:
    probing = breaker_admit(open_at(0.0), 30.0, "probe")
    assert probing is not None
    assert breaker_settle(probing, TERMS, 31.0, "probe", Effect.SUCCESS) == BreakerState()


def test_probe_failure_reopens_with_a_new_cooldown() -> None:
    probing = breaker_admit(open_at(0.0), 30.0, "probe")
    assert probing is not None
    state = breaker_settle(probing, TERMS, 35.0, "probe", Effect.FAILURE)
    assert state.mode == "open"
    assert state.open_until == 65.0
    assert state.probe is None
    assert breaker_admit(state, 64.0, "x") is None
    assert breaker_reopens_at(state, 40.0) == 65.0


def test_neutral_probe_frees_the_probe_slot() -> None:
    probing = breaker_admit(open_at(0.0), 30.0, "probe")
    assert probing is not None
    freed = breaker_settle(probing, TERMS, 31.0, "probe", Effect.NEUTRAL)
    assert freed.mode == "half_open"
    assert freed.probe is None
    again = breaker_admit(freed, 31.0, "next")
    assert again is not None
    assert again.probe == "next"


def test_failure_of_a_non_probe_while_half_open_changes_nothing() -> None:
    probing = breaker_admit(open_at(0.0), 30.0, "probe")
    assert probing is not None
    assert breaker_settle(probing, TERMS, 31.0, "late", Effect.FAILURE) == probing
    assert breaker_settle(probing, TERMS, 31.0, "late", Effect.NEUTRAL) == probing


def test_failure_while_open_does_not_extend_the_cooldown() -> None:
    state = open_at(0.0)
    assert breaker_settle(state, TERMS, 10.0, "late", Effect.FAILURE) == state


def test_auth_failure_opens_for_the_auth_cooldown() -> None:
    state = breaker_settle(BreakerState(), TERMS, 100.0, "p", Effect.AUTH_FAILURE)
    assert state.mode == "open"
    assert state.open_until == 700.0
    assert breaker_admit(state, 699.0, "x") is None
    assert breaker_reopens_at(state, 100.0) == 700.0


def test_auth_failure_never_shortens_a_later_open_until() -> None:
    long_open = BreakerState(mode="open", failures=3, open_until=5000.0)
    state = breaker_settle(long_open, TERMS, 100.0, "p", Effect.AUTH_FAILURE)
    assert state.open_until == 5000.0


def test_auth_failure_of_a_probe_reopens_for_the_auth_cooldown() -> None:
    probing = breaker_admit(open_at(0.0), 30.0, "probe")
    assert probing is not None
    state = breaker_settle(probing, TERMS, 30.0, "probe", Effect.AUTH_FAILURE)
    assert state.mode == "open"
    assert state.open_until == 630.0
    assert state.probe is None


def test_reopens_at_is_unknown_once_the_cooldown_passed() -> None:
    state = open_at(0.0)
    assert breaker_reopens_at(state, 30.0) is None
    assert breaker_reopens_at(state, 31.0) is None


@pytest.mark.parametrize(
    ("kind", "credentials_rejected", "effect"),
    [
        (OutcomeKind.SUCCESS, False, Effect.SUCCESS),
        (OutcomeKind.TRANSIENT, False, Effect.FAILURE),
        (OutcomeKind.RATE_LIMITED, False, Effect.NEUTRAL),
        (OutcomeKind.REJECTED, False, Effect.NEUTRAL),
        (OutcomeKind.REJECTED, True, Effect.AUTH_FAILURE),
        (OutcomeKind.FATAL, False, Effect.NEUTRAL),
    ],
)
def test_effect_of_maps_outcomes_to_health(
    kind: OutcomeKind, credentials_rejected: bool, effect: Effect
) -> None:
    assert effect_of(kind, credentials_rejected) is effect


def test_a_429_never_counts_as_a_breaker_failure() -> None:
    neutral = effect_of(OutcomeKind.RATE_LIMITED)
    state = settle_many(BreakerState(), [neutral] * 100)
    assert state == BreakerState()


def test_a_rejection_is_neutral_unless_its_credentials_were_rejected() -> None:
    # The default: a rejected request (a 400, a 404) says nothing about the source.
    assert effect_of(OutcomeKind.REJECTED) is Effect.NEUTRAL


def test_an_opened_breaker_keeps_the_count_of_failures_that_opened_it() -> None:
    # The count is what status, metrics and `polygate-celery source` report.
    state = open_at(0.0)
    assert state.failures == TERMS.failure_threshold


def test_a_failing_probe_keeps_the_failure_count() -> None:
    probing = breaker_admit(open_at(0.0), 30.0, "probe")
    assert probing is not None
    state = breaker_settle(probing, TERMS, 35.0, "probe", Effect.FAILURE)
    assert state.failures == TERMS.failure_threshold


def test_an_auth_failure_keeps_the_failure_count() -> None:
    state = settle_many(BreakerState(), [Effect.FAILURE, Effect.FAILURE])
    state = breaker_settle(state, TERMS, 0.0, "p", Effect.AUTH_FAILURE)
    assert state.mode == "open"
    assert state.failures == 2
