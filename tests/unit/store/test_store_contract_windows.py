"""Store contract, part 6: a provider that counts requests in windows, told by its resets.

An answer's requests reset far from what a bucket would announce shows a provider
counting in windows; then, unless the user declared `rpm_window`, requests follow the
provider's own window fleet-wide: what is left of it until it ends, then the whole
limit (SPEC §5, learned quotas). Time moves only with `VirtualClock.advance()`.
"""

from __future__ import annotations

import pytest

from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.quota import ARRIVAL_MARGIN_S, PERIOD_S, WINDOW_KEPT_S
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store import Denial
from tests.unit.store.conftest import Harness

SOURCE = SourceTerms("hosted", 100)


def requests(limit: int, remaining: int, reset_s: float | None) -> RateLimits:
    return RateLimits(requests_limit=limit, requests_remaining=remaining, requests_reset_s=reset_s)


async def announce(h: Harness, limits: RateLimits, source: SourceTerms = SOURCE) -> None:
    assert await h.settle(await h.grant(source), source, limits=limits)


async def grants(h: Harness, source: SourceTerms, n: int) -> None:
    for _ in range(n):
        await h.grant(source)


async def test_a_window_is_followed_to_its_end_then_its_whole_limit_is_admitted(
    h: Harness,
) -> None:
    await announce(h, requests(10, 9, 59.0))  # the window's first request: it ends in 59 s
    await grants(h, SOURCE, 9)
    denial = await h.deny(SOURCE)
    assert denial.blocked == (("hosted", "quota"),)
    assert denial.reopen_in_s == pytest.approx(59.0)
    h.clock.advance(30.0)
    await h.deny(SOURCE)  # a bucket would have refilled five by now
    h.clock.advance(29.0)
    await grants(h, SOURCE, 10)  # a new window: all of it at once
    await h.deny(SOURCE)
    h.clock.advance(ARRIVAL_MARGIN_S + PERIOD_S)
    await grants(h, SOURCE, 10)


async def test_a_bucket_refills_evenly_as_before(h: Harness) -> None:
    await announce(h, requests(10, 9, 6.0))  # one spent: full again in 6 s
    await grants(h, SOURCE, 9)
    denial = await h.deny(SOURCE)
    assert denial.reopen_in_s == pytest.approx(6.0)
    h.clock.advance(6.0)
    await h.grant(SOURCE)
    await h.deny(SOURCE)


async def test_a_declared_rpm_joins_the_window_and_its_bucket_no_longer_holds_it(
    h: Harness,
) -> None:
    declared = SourceTerms("declared", 100, quota=QuotaTerms("key", rpm=5))
    await announce(h, requests(10, 9, 59.0), declared)
    await grants(h, declared, 4)  # the declared 5 in this window
    assert (await h.deny(declared)).reopen_in_s == pytest.approx(59.0)
    h.clock.advance(59.0)
    await grants(h, declared, 5)  # a bucket of 5 would give one per 12 s
    await h.deny(declared)


@pytest.mark.parametrize("window", ["bucket", "sliding"])
async def test_a_declared_rpm_window_is_honoured_over_what_is_learned(
    h: Harness, window: str
) -> None:
    declared = SourceTerms(
        "declared",
        100,
        quota=QuotaTerms("key", rpm=600, rpm_window=window),  # type: ignore[arg-type]
    )
    await announce(h, requests(10, 9, 59.0), declared)
    await grants(h, declared, 9)
    await h.deny(declared)
    h.clock.advance(6.0)  # the learned bucket refills one request per 6 s
    await h.grant(declared)


async def test_answers_without_a_reset_or_with_hostile_ones_leave_the_bucket(
    h: Harness,
) -> None:
    for limits in (
        requests(10, 9, None),
        requests(10, 9, float("nan")),
        requests(10, 9, float("inf")),
        requests(10, 9, -5.0),
        requests(10, 9, 86_400.0),  # a day's limit
        RateLimits(requests_limit=10, requests_remaining=11, requests_reset_s=59.0),
    ):
        await announce(h, limits)
    for _ in range(10):
        if isinstance(await h.admit(SOURCE), Denial):
            break
    denial = await h.deny(SOURCE)
    assert denial.reopen_in_s is not None
    assert denial.reopen_in_s <= 6.0  # a bucket's refill, not a window's end


async def test_the_window_is_kept_by_the_fleet_not_by_one_caller(h: Harness) -> None:
    await announce(h, requests(10, 9, 50.0))
    for n in range(9):  # another worker of the fleet spends the window
        await h.grant(SOURCE, permit_id=f"other-{n}")
    assert (await h.deny(SOURCE)).reopen_in_s == pytest.approx(50.0)


async def test_requests_counted_as_a_bucket_meanwhile_count_in_the_window(h: Harness) -> None:
    # A bucket's answer first (the window not yet shown), then more requests, then an
    # answer that shows the window: what was admitted meanwhile is not given back.
    await announce(h, requests(10, 9, 6.0))
    await grants(h, SOURCE, 3)
    await announce(h, requests(10, 9, 55.0))  # late: it counts only the first request
    await grants(h, SOURCE, 5)  # 9 less the three and the announcer's own
    assert (await h.deny(SOURCE)).reopen_in_s == pytest.approx(55.0)


async def test_without_a_window_shown_for_a_while_the_bucket_returns(h: Harness) -> None:
    await announce(h, requests(10, 9, 59.0))
    h.clock.advance(WINDOW_KEPT_S + 1.0)
    await announce(h, requests(10, 9, 6.0))  # a bucket's answer; no window shown since
    await grants(h, SOURCE, 8)  # a new window would take one more
    denial = await h.deny(SOURCE)
    assert denial.reopen_in_s is not None
    assert denial.reopen_in_s <= 6.0


async def test_a_window_provider_refused_is_not_booked(h: Harness) -> None:
    await announce(h, requests(10, 9, 59.0))
    await grants(h, SOURCE, 9)
    denial = await h.deny(SOURCE, waiter="call-1", book_within_s=120.0)
    assert denial.booked_in_s is None
    assert denial.reopen_in_s == pytest.approx(59.0)
