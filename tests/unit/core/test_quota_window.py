"""The sliding window, the bucket's charge, settle and spent share (core.quota)."""

from __future__ import annotations

import pytest

from polygate_celery.core.quota import (
    ARRIVAL_MARGIN_S,
    PERIOD_S,
    WINDOW_MARGIN_S,
    WINDOW_S,
    gcra_charge,
    gcra_reserve,
    gcra_settle,
    gcra_spent,
    requests_spent,
    window_wait,
)


def test_the_window_is_a_period_plus_the_margin() -> None:
    assert WINDOW_MARGIN_S == 0.5
    assert WINDOW_S == PERIOD_S + WINDOW_MARGIN_S


def test_a_window_with_room_admits_now() -> None:
    assert window_wait([], 100.0, 3) is None
    assert window_wait([10.0, 20.0], 100.0, 3) is None


def test_a_full_window_waits_until_its_oldest_admission_leaves() -> None:
    # Three admissions in the window, limit 3: the one at t=10 leaves at 10 + 60.5.
    assert window_wait([10.0, 20.0, 30.0], 40.0, 3) == pytest.approx(10.0 + WINDOW_S - 40.0)


def test_an_overfull_window_waits_for_enough_admissions_to_leave() -> None:
    # Limit lowered to 2 with four in the window: three must leave before one more fits.
    assert window_wait([10.0, 20.0, 30.0, 35.0], 40.0, 2) == pytest.approx(30.0 + WINDOW_S - 40.0)


def test_a_full_window_whose_oldest_is_already_due_waits_zero() -> None:
    assert window_wait([10.0], 10.0 + WINDOW_S + 5.0, 1) == 0.0


def test_charge_moves_the_tat_one_request_ahead() -> None:
    assert gcra_charge(0.0, 100.0, 60) == pytest.approx(101.0)  # idle bucket: from now
    assert gcra_charge(110.0, 100.0, 60) == pytest.approx(111.0)  # busy bucket: from its tat


def test_charge_never_moves_the_tat_more_than_a_period_ahead() -> None:
    assert gcra_charge(100.0 + PERIOD_S, 100.0, 60) == pytest.approx(100.0 + PERIOD_S)
    assert gcra_charge(500.0, 100.0, 60) == pytest.approx(100.0 + PERIOD_S)


def test_charges_make_a_bucket_refuse_what_a_window_admitted() -> None:
    tat = 0.0
    for _ in range(60):
        tat = gcra_charge(tat, 100.0, 60)
    # The window admitted the whole minute (keeping its own margin): the bucket's next
    # waits one interval.
    _, wait = gcra_reserve(tat, 100.0, 1.0, 60)
    assert wait == pytest.approx(1.0)


def test_settle_refunds_an_overestimate() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 800.0, limit=1000)  # charged as arriving late
    assert gcra_settle(tat, 800.0, 200.0, 1000) == pytest.approx(100.5 + 200 * 0.06)


def test_settle_charges_an_underestimate() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 100.0, limit=1000)
    assert gcra_settle(tat, 100.0, 400.0, 1000) == pytest.approx(100.5 + 400 * 0.06)


def test_settle_with_zero_used_refunds_the_whole_reservation() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 300.0, limit=1000)
    assert gcra_settle(tat, 300.0, 0.0, 1000) == pytest.approx(100.0 + ARRIVAL_MARGIN_S)


def test_settle_clamps_both_sides_to_the_limit_as_the_reservation_was() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 5000.0, limit=1000)  # charged as the limit
    assert tat == pytest.approx(100.5 + PERIOD_S)
    # Used 3000 (also above the limit): nothing more to charge, nothing to refund.
    assert gcra_settle(tat, 5000.0, 3000.0, 1000) == pytest.approx(100.5 + PERIOD_S)
    # Used 500: refunds what was charged above 500, not 5000 - 500.
    assert gcra_settle(tat, 5000.0, 500.0, 1000) == pytest.approx(130.5)


def test_settle_reads_negative_amounts_as_zero() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 200.0, limit=1000)
    assert gcra_settle(tat, 200.0, -50.0, 1000) == pytest.approx(100.5)
    assert gcra_settle(tat, -50.0, 100.0, 1000) == pytest.approx(112.5 + 6.0)


def test_spent_is_the_share_of_the_allowance_the_tat_is_ahead() -> None:
    # less the margin each admission is charged ahead
    assert gcra_spent(130.5, 100.0, 60) == pytest.approx(30.0)
    assert gcra_spent(160.5, 100.0, 1000) == pytest.approx(1000.0)
    tat, _ = gcra_reserve(0.0, 100.0, 1.0, limit=60)
    assert gcra_spent(tat, 100.0, 60) == pytest.approx(1.0)


def test_spent_is_zero_when_the_tat_is_not_ahead() -> None:
    assert gcra_spent(100.0, 100.0, 60) == 0.0
    assert gcra_spent(50.0, 100.0, 60) == 0.0


def test_spent_may_pass_the_limit_after_an_underestimate() -> None:
    assert gcra_spent(100.5 + 2 * PERIOD_S, 100.0, 60) == pytest.approx(120.0)


def test_requests_spent_without_an_rpm_limit_is_unknown() -> None:
    assert requests_spent(None, "sliding", 5, 130.0, 100.0) is None
    assert requests_spent(None, "bucket", 5, 130.0, 100.0) is None


def test_requests_spent_of_a_sliding_window_counts_its_admissions() -> None:
    spent = requests_spent(60, "sliding", 7, 130.0, 100.0)
    assert spent == 7.0
    assert isinstance(spent, float)


def test_requests_spent_of_a_bucket_is_its_spent_share() -> None:
    assert requests_spent(60, "bucket", 7, 130.5, 100.0) == pytest.approx(30.0)
