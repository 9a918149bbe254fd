"""The per-source adaptive concurrency limit (AIMD) as pure transitions."""

from __future__ import annotations

import math

import pytest

from polygate_celery.core.aimd import (
    AimdState,
    aimd_initial,
    aimd_on_congestion,
    aimd_on_success,
    aimd_permits,
)
from polygate_celery.core.terms import AimdTerms

TERMS = AimdTerms()


def test_defaults_match_the_spec() -> None:
    assert (TERMS.increase, TERMS.decrease_factor, TERMS.initial_limit) == (1.0, 0.5, None)


def test_initial_limit_defaults_to_the_cap() -> None:
    assert aimd_initial(TERMS, cap=8).limit == 8.0


@pytest.mark.parametrize(("initial", "cap", "expected"), [(3, 8, 3.0), (20, 8, 8.0), (1, 1, 1.0)])
def test_initial_limit_is_clamped_to_the_cap(initial: int, cap: int, expected: float) -> None:
    assert aimd_initial(AimdTerms(initial_limit=initial), cap).limit == expected


def test_initial_state_has_never_decreased() -> None:
    assert aimd_initial(TERMS, 4).last_decrease_at == -math.inf


def test_success_adds_the_increase() -> None:
    state = aimd_on_success(AimdState(limit=3.0), TERMS, cap=8)
    assert state.limit == 4.0
    state = aimd_on_success(state, AimdTerms(increase=0.5), cap=8)
    assert state.limit == 4.5


def test_success_is_capped_at_the_cap() -> None:
    state = AimdState(limit=7.5)
    for _ in range(5):
        state = aimd_on_success(state, TERMS, cap=8)
    assert state.limit == 8.0


def test_success_keeps_the_last_decrease_time() -> None:
    state = aimd_on_success(AimdState(limit=2.0, last_decrease_at=50.0), TERMS, cap=8)
    assert state.last_decrease_at == 50.0


def test_congestion_multiplies_by_the_decrease_factor() -> None:
    state = aimd_on_congestion(AimdState(limit=8.0), TERMS, admitted_at=10.0, now=11.0)
    assert state.limit == 4.0
    assert state.last_decrease_at == 11.0
    state = aimd_on_congestion(state, AimdTerms(decrease_factor=0.25), admitted_at=12.0, now=13.0)
    assert state.limit == 1.0


def test_congestion_floors_at_one() -> None:
    state = AimdState(limit=1.0)
    for t in range(5):
        state = aimd_on_congestion(state, TERMS, admitted_at=float(t) + 0.5, now=float(t) + 1)
        assert state.limit == 1.0


def test_one_halving_per_congestion_episode() -> None:
    # Four requests admitted together at t=10 all come back 429 at t=12..15.
    state = AimdState(limit=8.0)
    for now in (12.0, 13.0, 14.0, 15.0):
        state = aimd_on_congestion(state, TERMS, admitted_at=10.0, now=now)
    assert state.limit == 4.0
    assert state.last_decrease_at == 12.0


def test_an_attempt_admitted_after_the_decrease_decreases_again() -> None:
    state = aimd_on_congestion(AimdState(limit=8.0), TERMS, admitted_at=10.0, now=12.0)
    state = aimd_on_congestion(state, TERMS, admitted_at=12.5, now=20.0)
    assert state.limit == 2.0
    assert state.last_decrease_at == 20.0


def test_congestion_settled_at_the_same_instant_halves_once() -> None:
    # Zero-latency 429s: admitted and settled at one instant, still one episode.
    state = AimdState(limit=8.0)
    for _ in range(3):
        state = aimd_on_congestion(state, TERMS, admitted_at=10.0, now=10.0)
    assert state.limit == 4.0


def test_successes_between_episodes_recover_additively() -> None:
    state = aimd_on_congestion(AimdState(limit=8.0), TERMS, admitted_at=0.0, now=1.0)
    for _ in range(2):
        state = aimd_on_success(state, TERMS, cap=8)
    assert state.limit == 6.0


@pytest.mark.parametrize(
    ("limit", "cap", "permits"),
    [(4.0, 8, 4), (4.9, 8, 4), (1.0, 8, 1), (0.3, 8, 1), (12.0, 8, 8), (8.0, 8, 8)],
)
def test_permits_floor_and_clamp_the_limit(limit: float, cap: int, permits: int) -> None:
    assert aimd_permits(AimdState(limit=limit), cap) == permits
