"""RPM/TPM quotas as GCRA over a 60 s period."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from polygate_celery.core.quota import (
    ARRIVAL_MARGIN_S,
    BURST_S,
    PERIOD_S,
    gcra_adjust,
    gcra_book,
    gcra_reserve,
    learned_tat,
)

AT_ONCE = math.floor(60 * BURST_S / PERIOD_S)
"""Requests a full bucket of 60 rpm admits at once: 59, the 60th after the margin."""


def burst(tat: float, now: float, count: int, limit: int) -> float:
    for i in range(count):
        tat, wait = gcra_reserve(tat, now, 1.0, limit)
        assert wait is None, f"request {i + 1} of the burst was refused"
    return tat


def test_period_is_one_minute() -> None:
    assert PERIOD_S == 60.0


def test_the_burst_is_a_period_less_the_arrival_margin() -> None:
    assert ARRIVAL_MARGIN_S == 0.5
    assert BURST_S == PERIOD_S - ARRIVAL_MARGIN_S
    assert AT_ONCE == 59


def test_a_minute_less_the_margin_passes_at_once_then_the_last_waits_the_margin() -> None:
    tat = burst(0.0, now=1000.0, count=AT_ONCE, limit=60)
    new_tat, wait = gcra_reserve(tat, 1000.0, 1.0, 60)
    assert new_tat == tat  # a refused request changes nothing
    assert wait == pytest.approx(ARRIVAL_MARGIN_S)  # the 60th of the minute
    tat = burst(tat, now=1000.0 + ARRIVAL_MARGIN_S, count=1, limit=60)
    _, wait = gcra_reserve(tat, 1000.0 + ARRIVAL_MARGIN_S, 1.0, 60)
    assert wait == pytest.approx(1.0)  # then one interval each


def test_the_refused_request_passes_once_its_wait_is_over() -> None:
    tat = burst(0.0, now=1000.0, count=AT_ONCE, limit=60)
    _, wait = gcra_reserve(tat, 1000.0 + ARRIVAL_MARGIN_S / 2, 1.0, 60)
    assert wait == pytest.approx(ARRIVAL_MARGIN_S / 2)
    _, wait = gcra_reserve(tat, 1000.0 + ARRIVAL_MARGIN_S, 1.0, 60)
    assert wait is None


def test_the_quota_refills_over_time() -> None:
    tat = burst(0.0, now=1000.0, count=AT_ONCE, limit=60)
    # Ten seconds later ten requests' worth has refilled, and no more: the next waits
    # the margin again, as the one after the burst did.
    tat = burst(tat, now=1010.0, count=10, limit=60)
    _, wait = gcra_reserve(tat, 1010.0, 1.0, 60)
    assert wait == pytest.approx(ARRIVAL_MARGIN_S)


def test_an_idle_minute_refills_the_whole_allowance_and_never_more() -> None:
    tat = burst(0.0, now=1000.0, count=AT_ONCE, limit=60)
    tat = burst(tat, now=5000.0, count=AT_ONCE, limit=60)
    _, wait = gcra_reserve(tat, 5000.0, 1.0, 60)
    assert wait == pytest.approx(ARRIVAL_MARGIN_S)  # as from a bucket idle forever


def test_token_cost_moves_the_tat_proportionally() -> None:
    tat, wait = gcra_reserve(0.0, 100.0, 500.0, limit=1000)
    assert wait is None
    assert tat == pytest.approx(100.0 + ARRIVAL_MARGIN_S + 30.0)  # charged as arriving late
    # 600 more takes the TAT 66.5 s ahead: 6 s past the period, and the margin.
    _, wait = gcra_reserve(tat, 100.0, 600.0, limit=1000)
    assert wait == pytest.approx(6.0 + ARRIVAL_MARGIN_S)


def test_cost_above_the_limit_is_charged_as_the_limit_when_the_bucket_is_full() -> None:
    tat, wait = gcra_reserve(0.0, 100.0, 5000.0, limit=1000)
    assert wait is None
    assert tat == pytest.approx(100.0 + ARRIVAL_MARGIN_S + PERIOD_S)


def test_cost_above_the_limit_waits_for_a_full_refill() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 1.0, limit=60)
    _, wait = gcra_reserve(tat, 100.0, 10_000.0, limit=60)
    assert wait == pytest.approx(1.0 + ARRIVAL_MARGIN_S)  # the one before arrives late
    _, wait = gcra_reserve(tat, 101.0 + ARRIVAL_MARGIN_S, 10_000.0, limit=60)
    assert wait is None


def test_negative_cost_is_charged_as_zero() -> None:
    tat, wait = gcra_reserve(0.0, 100.0, -5.0, limit=60)
    assert wait is None
    assert tat == 100.0 + ARRIVAL_MARGIN_S


def test_adjust_refunds_an_overestimate() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 800.0, limit=1000)  # estimated 800 tokens
    tat = gcra_adjust(tat, -600.0, limit=1000)  # really used 200
    assert tat == pytest.approx(100.0 + ARRIVAL_MARGIN_S + 200 * 0.06)
    # The 800 back are there again: spending them fills the minute, which waits only
    # the margin (36.5 s without the refund).
    _, wait = gcra_reserve(tat, 100.0, 800.0, limit=1000)
    assert wait == pytest.approx(ARRIVAL_MARGIN_S)


def test_adjust_charges_an_underestimate() -> None:
    tat, _ = gcra_reserve(0.0, 100.0, 100.0, limit=1000)
    tat = gcra_adjust(tat, 900.0, limit=1000)
    assert tat == pytest.approx(100.0 + ARRIVAL_MARGIN_S + PERIOD_S)
    _, wait = gcra_reserve(tat, 100.0, 1.0, limit=1000)
    assert wait == pytest.approx(0.06 + ARRIVAL_MARGIN_S)


def test_an_announcement_reads_limit_minus_remaining_as_spent() -> None:
    assert learned_tat(-float("inf"), 100.0, 120, 90) == pytest.approx(100.0 + 30 * 0.5)
    assert learned_tat(-float("inf"), 100.0, 120, 120) == 100.0  # full: nothing ahead


def test_an_announcement_never_moves_the_fleets_count_back() -> None:
    assert learned_tat(130.0, 100.0, 120, 110) == 130.0


def test_an_out_of_range_remaining_is_clamped_to_the_limit() -> None:
    assert learned_tat(0.0, 100.0, 60, -5) == pytest.approx(100.0 + PERIOD_S)
    assert learned_tat(0.0, 100.0, 60, 500) == 100.0


# --- why the margin ---------------------------------------------------------------------

Reserve = Callable[[float, float, int], tuple[float, float | None]]


def plain_reserve(tat: float, now: float, limit: int) -> tuple[float, float | None]:
    """One request against a plain token bucket of `limit` a period: no margin."""
    over = max(tat - now, 0.0) + PERIOD_S / limit - PERIOD_S
    if over > 0:
        return tat, over
    return max(tat, now) + PERIOD_S / limit, None


def margin_reserve(tat: float, now: float, limit: int) -> tuple[float, float | None]:
    return gcra_reserve(tat, now, 1.0, limit)


def admit_greedily(reserve: Reserve, count: int, limit: int) -> list[float]:
    """When `count` requests sent as soon as `reserve` admits each are admitted, from a
    full bucket at 0: a burst, then steady traffic at the limit."""
    tat, now, admitted = 0.0, 0.0, []
    for _ in range(count):
        new_tat, wait = reserve(tat, now, limit)
        while wait is not None:
            now += wait
            new_tat, wait = reserve(tat, now, limit)
        tat = new_tat
        admitted.append(now)
    return admitted


def provider_refusals(arrivals: Sequence[float], limit: int) -> list[float]:
    """The arrivals a provider's token bucket of `limit` a period (full at 0) refuses,
    checking each in the order they reach it."""
    tat, refused = 0.0, []
    for arrival in sorted(arrivals):
        tat, wait = plain_reserve(tat, arrival, limit)
        if wait is not None:
            refused.append(arrival)
    return refused


def arrive(admitted: Sequence[float], lags: Sequence[float]) -> list[float]:
    return [at + lag for at, lag in zip(admitted, lags, strict=True)]


@pytest.mark.parametrize("limit", [1, 3, 7, 60])
def test_arrivals_trailing_admissions_by_up_to_the_margin_never_find_the_provider_short(
    limit: int,
) -> None:
    """Why the bucket keeps `ARRIVAL_MARGIN_S` in hand: a provider counts a request when
    it arrives, which trails its admission unevenly by up to the margin. Admitted by the
    bucket, a burst then steady traffic at the limit never finds a provider's bucket of
    the same size short; admitted by a plain bucket of a period, the same lags do."""
    count = 3 * limit  # a full bucket's burst, then two minutes at the limit
    with_margin = admit_greedily(margin_reserve, count, limit)
    without_margin = admit_greedily(plain_reserve, count, limit)
    # the same steady rate, the margin later; at one a minute, each request must wait
    # for the latest arrival of the one before, so each is the margin later
    later = ARRIVAL_MARGIN_S if limit > 1 else ARRIVAL_MARGIN_S * (count - 1)
    assert with_margin[-1] == pytest.approx(without_margin[-1] + later)

    refused_without_margin = 0
    for seed in range(10):
        rng = random.Random(seed)
        lags = [rng.uniform(0.0, ARRIVAL_MARGIN_S) for _ in range(count)]
        assert provider_refusals(arrive(with_margin, lags), limit) == []
        refused_without_margin += provider_refusals(arrive(without_margin, lags), limit) != []
    assert refused_without_margin > 0

    # The worst case: the burst arrives the whole margin late, the rest at once.
    def worst(admitted: list[float]) -> list[float]:
        return [ARRIVAL_MARGIN_S if at == admitted[0] else 0.0 for at in admitted]

    assert provider_refusals(arrive(with_margin, worst(with_margin)), limit) == []
    assert provider_refusals(arrive(without_margin, worst(without_margin)), limit) != []


def test_a_booking_in_an_empty_bucket_is_for_now_and_charged_as_an_admission() -> None:
    slot, tats = gcra_book([(0.0, 1.0, 60), (0.0, 500.0, 1000)], now=1000.0)
    assert slot == 1000.0
    assert tats == [
        gcra_reserve(0.0, 1000.0, 1.0, 60)[0],
        gcra_reserve(0.0, 1000.0, 500.0, 1000)[0],
    ]


def test_a_booking_is_the_soonest_slot_every_bucket_admits_charged_as_there() -> None:
    """At its slot each bucket admits the booking, and charges it as `gcra_reserve` would
    there; a little before the slot, one of them would still refuse it."""
    rng = random.Random(7)
    for _ in range(2_000):
        now = 1000.0
        dims = []
        for _ in range(rng.choice([1, 2])):
            limit = rng.choice([1, 3, 60, 1000])
            cost = rng.choice([1.0, limit * rng.uniform(0.0, 1.5)])
            dims.append((now + rng.uniform(-10.0, 70.0), cost, limit))
        slot, tats = gcra_book(dims, now)
        assert slot >= now
        for (tat, cost, limit), booked in zip(dims, tats, strict=True):
            admitted, wait = gcra_reserve(tat, slot + 1e-9, cost, limit)  # (rounding)
            assert wait is None, (dims, slot)
            assert booked == pytest.approx(admitted, abs=1e-6), (dims, slot)
        if slot > now + 1e-6:
            earlier = slot - 1e-3
            assert any(gcra_reserve(t, earlier, c, lim)[1] for t, c, lim in dims), (dims, slot)
