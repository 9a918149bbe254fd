"""The one backoff function every kind shares (SPEC §3 rule 4)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polygate_celery.core.backoff import backoff_delay, jitter


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0), (6, 30.0), (7, 30.0)],
)
def test_backoff_doubles_per_failure_until_the_cap_with_factor_half_at_u_zero(
    n: int, expected: float
) -> None:
    # base 2, cap 60, u = 0 → factor 0.5: 2·2^(n-1)·0.5, capped at 60·0.5.
    assert backoff_delay(n, base_s=2.0, max_s=60.0, u=0.0) == expected


@pytest.mark.parametrize("n", [0, -1, -1000])
def test_backoff_counts_n_below_one_as_the_base_tier(n: int) -> None:
    assert backoff_delay(n, 2.0, 60.0, 0.0) == backoff_delay(1, 2.0, 60.0, 0.0) == 1.0


def test_backoff_of_the_seed_acceptance_example_is_one_second() -> None:
    # backoff_base_s = 2, random source fixed at 0: the first backoff is 1 s.
    assert backoff_delay(1, 2.0, 60.0, 0.0) == 1.0


@pytest.mark.parametrize("n", [64, 65, 1024, 1025, 10**6, 10**18])
def test_backoff_does_not_overflow_for_huge_n(n: int) -> None:
    delay = backoff_delay(n, 2.0, 60.0, 0.0)
    assert delay == 30.0
    assert math.isfinite(delay)


def test_backoff_is_capped_at_max_s_before_jitter() -> None:
    assert backoff_delay(100, 2.0, 60.0, 0.999) == pytest.approx(60.0 * (0.5 + 0.5 * 0.999))
    assert backoff_delay(100, 2.0, 60.0, 0.999) < 60.0


def test_backoff_uses_the_draw_as_jitter() -> None:
    assert backoff_delay(2, 2.0, 60.0, 0.5) == pytest.approx(4.0 * 0.75)


@pytest.mark.parametrize(("u", "factor"), [(0.0, 0.5), (0.5, 0.75), (0.25, 0.625)])
def test_jitter_maps_the_draw_onto_half_to_one(u: float, factor: float) -> None:
    assert jitter(u) == factor


def test_jitter_stays_below_one_for_ordinary_draws_below_one() -> None:
    # At the very last float below 1.0, 0.5 + 0.5u rounds to exactly 1.0 (as with
    # random.uniform); any draw at least a few ulps below 1.0 stays below it.
    assert jitter(0.999_999) < 1.0
    assert jitter(math.nextafter(1.0, 0.0)) <= 1.0


@settings(derandomize=True, max_examples=300)
@given(
    n=st.integers(min_value=-10, max_value=10_000),
    base_s=st.floats(min_value=0.001, max_value=100.0),
    extra_s=st.floats(min_value=0.0, max_value=10_000.0),
    # Bounded a hair below 1.0: the last few float ulps round the factor up to 1.0.
    u=st.floats(min_value=0.0, max_value=0.999_999),
)
def test_backoff_is_within_half_to_one_of_the_capped_exponential(
    n: int, base_s: float, extra_s: float, u: float
) -> None:
    max_s = base_s + extra_s
    capped = min(max_s, base_s * 2.0 ** min(max(n, 1) - 1, 64))
    delay = backoff_delay(n, base_s, max_s, u)
    assert 0.5 * capped <= delay < capped
