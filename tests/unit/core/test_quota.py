"""RPM/TPM quotas as GCRA over a 60 s period."""

from __future__ import annotations

import pytest

from polygate_celery.core.quota import PERIOD_S, gcra_adjust, gcra_reserve, learned_tat


def burst(tat: float, now: float, count: int, limit: int) -> float:
    for i in range(count):
        tat, wait = gcra_reserve(tat, now, 1.0, limit)
        assert wait is None, f"request {i + 1} of the burst was refused"
    return tat


def test_period_is_one_minute() -> None:
    assert PERIOD_S == 60.0


def test_a_full_minute_of_requests_passes_then_the_next_waits_one_interval() -> None:
    tat = burst(0.0, now=1000.0, count=60, limit=60)
    new_tat, wait = gcra_reserve(tat, 1000.0, 1.0, 60)
    assert new_tat == tat  # a refused request changes nothing
    assert wait == pytest.approx(1.0)


def test_the_refused_request_passes_once_its_wait_is_over() -> None:
    tat = burst(0.0, now=1000.0, count=60, limit=60)
    _, wait = gcra_reserve(tat, 1000.5, 1.0, 60)
    assert wait == pytest.approx(0.5)
    _, wait = gcra_reserve(tat, 1001.0, 1.0, 60)
    assert wait is None


def test_the_quota_refills_over_time() -> None:
    tat = burst(0.0, now=1000.0, count=60, limit=60)
    # Ten seconds later ten requests' worth has refilled, and no more.
    tat = burst(tat, now=1010.0, count=10, limit=60)
    _, wait = gcra_reserve(tat, 1010.0, 1.0, 60)
    assert wait == pytest.approx(1.0)


def test_an_idle_minute_refills_the_whole_allowance_and_never_more() -> None:
    tat = burst(0.0, now=1000.0, count=60, limit=60)
    tat = burst(tat, now=5000.0, count=60, limit=60)
    _, wait = gcra_reserve(tat, 5000.0, 1.0, 60)
    assert wait is not None


def test_token_cost_moves_the_tat_proportionally() -> None:
    tat, wait = gcra_reserve(0.0, 100.0, 500.0, limit=1000)
    assert wait is None
    assert tat == pytest.approx(130.0)
    _, wait = gcra_reserve(tat, 100.0, 600.0, limit=1000)
    assert wait == pytest.approx(6.0)


def test_cost_above_the_limit_is_charged_as_the_limit_when_the_bucket_is_full() -> None:
    tat, wait = gcra_reserve(0.0, 100.0, 5000.0, limit=1000)
    assert wait is None
    assert tat == pytest.approx(160.0)


def test_cost_above_the_limit_waits_for_a_full_refill() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 1.0, limit=60)
    _, wait = gcra_reserve(tat, 100.0, 10_000.0, limit=60)
    assert wait == pytest.approx(1.0)
    _, wait = gcra_reserve(tat, 101.0, 10_000.0, limit=60)
    assert wait is None


def test_negative_cost_is_charged_as_zero() -> None:
    tat, wait = gcra_reserve(0.0, 100.0, -5.0, limit=60)
    assert wait is None
    assert tat == 100.0


def test_adjust_refunds_an_overestimate() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 800.0, limit=1000)  # estimated 800 tokens
    tat = gcra_adjust(tat, -600.0, limit=1000)  # really used 200
    assert tat == pytest.approx(100.0 + 200 * 0.06)
    _, wait = gcra_reserve(tat, 100.0, 800.0, limit=1000)
    assert wait is None


def test_adjust_charges_an_underestimate() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 100.0, limit=1000)
    tat = gcra_adjust(tat, 900.0, limit=1000)
    assert tat == pytest.approx(160.0)
    _, wait = gcra_reserve(tat, 100.0, 1.0, limit=1000)
    assert wait == pytest.approx(0.06)


def test_an_announcement_reads_limit_minus_remaining_as_spent() -> None:
    assert learned_tat(-float("inf"), 100.0, 120, 90) == pytest.approx(100.0 + 30 * 0.5)
    assert learned_tat(-float("inf"), 100.0, 120, 120) == 100.0  # full: nothing ahead


def test_an_announcement_never_moves_the_fleets_count_back() -> None:
    assert learned_tat(130.0, 100.0, 120, 110) == 130.0


def test_an_out_of_range_remaining_is_clamped_to_the_limit() -> None:
    assert learned_tat(0.0, 100.0, 60, -5) == pytest.approx(100.0 + PERIOD_S)
    assert learned_tat(0.0, 100.0, 60, 500) == 100.0
