"""Store contract, part 5: quotas learned from the provider's rate-limit headers.

A source whose answers announce a limit and what remains of it gets a bucket of
that limit (SPEC §3: a quota the provider announces costs what a declared one
does), fleet-wide, beside any declared quota. Time moves only with
`VirtualClock.advance()`.
"""

from __future__ import annotations

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.quota import LEARNED_TTL_S
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from tests.unit.store.conftest import Harness

SOURCE = SourceTerms("hosted", 100)


def requests(limit: int, remaining: int) -> RateLimits:
    return RateLimits(requests_limit=limit, requests_remaining=remaining)


async def announce(h: Harness, limits: RateLimits, source: SourceTerms = SOURCE) -> None:
    assert await h.settle(await h.grant(source), source, limits=limits)


async def test_a_source_that_announces_nothing_has_no_quota(h: Harness) -> None:
    for _ in range(50):
        await announce(h, RateLimits())
    assert (await h.snapshot(SOURCE)).learned_rpm is None


async def test_the_remaining_requests_are_admitted_then_the_bucket_refills_evenly(
    h: Harness,
) -> None:
    await announce(h, requests(60, 50))  # 10 spent of 60 per minute
    for _ in range(50):
        await h.grant(SOURCE)
    denial = await h.deny(SOURCE)
    assert denial.blocked == (("hosted", "quota"),)
    assert denial.reopen_in_s == pytest.approx(1.0)  # one request refills every 60/60 s
    h.clock.advance(1.0)
    await h.grant(SOURCE)
    await h.deny(SOURCE)
    assert (await h.snapshot(SOURCE)).learned_rpm == 60


async def test_an_exhausted_limit_holds_until_one_request_refills(h: Harness) -> None:
    await announce(h, requests(3, 0))
    denial = await h.deny(SOURCE)
    assert denial.reopen_in_s == pytest.approx(20.0)
    h.clock.advance(20.0)
    await h.grant(SOURCE)


async def test_an_announcement_never_gives_back_what_the_fleet_counted(h: Harness) -> None:
    await announce(h, requests(3, 0))
    h.clock.advance(20.0)
    # An answer sent before the others were counted says all three remain: the fleet's
    # own count stands.
    await announce(h, requests(3, 3))
    await h.deny(SOURCE)


async def test_an_announcement_is_learned_from_a_permit_no_longer_held(h: Harness) -> None:
    grant = await h.grant(SOURCE)
    assert await h.settle(grant, SOURCE)
    assert not await h.settle(grant, SOURCE, Effect.NEUTRAL, limits=requests(2, 0))
    await h.deny(SOURCE)


async def test_the_lower_of_a_declared_and_an_announced_limit_holds(h: Harness) -> None:
    declared = SourceTerms("declared", 100, quota=QuotaTerms("key", rpm=600))
    await announce(h, requests(2, 1), declared)
    await h.grant(declared)
    assert (await h.deny(declared)).blocked == (("declared", "quota"),)


async def test_announced_tokens_hold_the_estimate_and_settle_with_the_use(h: Harness) -> None:
    await announce(h, RateLimits(tokens_limit=1000, tokens_remaining=400))
    h.clock.advance(1.0)  # about 17 tokens refill
    await h.deny(SOURCE, est_tokens=500)
    grant = await h.grant(SOURCE, est_tokens=400)
    await h.deny(SOURCE, est_tokens=100)
    await h.settle(grant, SOURCE, est_tokens=400, used_tokens=100)  # 300 back
    await h.grant(SOURCE, est_tokens=300)
    assert (await h.snapshot(SOURCE)).learned_tpm == 1000


async def test_a_new_announced_limit_replaces_the_old_one(h: Harness) -> None:
    await announce(h, requests(2, 0))
    h.clock.advance(60.0)
    await announce(h, requests(600, 599))
    for _ in range(100):
        await h.grant(SOURCE)
    assert (await h.snapshot(SOURCE)).learned_rpm == 600


async def test_a_reset_keeps_what_the_provider_announced(h: Harness) -> None:
    await announce(h, requests(3, 0))
    await h.store.reset_source(SOURCE.name)
    await h.deny(SOURCE)


async def test_the_estimate_is_settled_before_the_announcement_is_taken(h: Harness) -> None:
    await announce(h, RateLimits(tokens_limit=1000, tokens_remaining=1000))
    h.clock.advance(1.0)
    grant = await h.grant(SOURCE, est_tokens=800)
    # 100 used; the provider counts 900 spent (another user of the key spent 800).
    limits = RateLimits(tokens_limit=1000, tokens_remaining=100)
    await h.settle(grant, SOURCE, est_tokens=800, used_tokens=100, limits=limits)
    await h.deny(SOURCE, est_tokens=200)  # 100 left, not the 700 a late refund would give
    await h.grant(SOURCE, est_tokens=100)


async def test_a_permit_admitted_before_the_tokens_were_learned_is_not_refunded(
    h: Harness,
) -> None:
    early = await h.grant(SOURCE, est_tokens=900)  # nothing learned yet: nothing charged
    h.clock.advance(1.0)
    await announce(h, RateLimits(tokens_limit=1000, tokens_remaining=0))
    await h.settle(early, SOURCE, est_tokens=900, used_tokens=0)  # no refund of 900
    await h.deny(SOURCE, est_tokens=100)


async def test_a_limit_not_announced_for_an_hour_is_forgotten(h: Harness) -> None:
    await announce(h, requests(1, 0))
    h.clock.advance(LEARNED_TTL_S + 1.0)
    assert (await h.snapshot(SOURCE)).learned_rpm is None
    for _ in range(5):
        await h.grant(SOURCE)
