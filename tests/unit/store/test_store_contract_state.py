"""Store contract, part 2: breaker, AIMD, RPM/TPM quotas and scope progress.

Written against the protocol only (SPEC §2, §3 and §5); time moves only with
`VirtualClock.advance()`, so every store implementation in `store_factory` must
pass it unchanged.
"""

from __future__ import annotations

import math

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.quota import ARRIVAL_MARGIN_S, PERIOD_S, WINDOW_S
from polygate_celery.core.terms import AimdTerms, BreakerTerms, QuotaTerms, SourceTerms
from tests.unit.store.conftest import Harness

BRITTLE = SourceTerms("brittle", 10, breaker=BreakerTerms(failure_threshold=3, cooldown_s=30))


async def fail(h: Harness, source: SourceTerms, effect: Effect = Effect.FAILURE) -> None:
    assert await h.settle(await h.grant(source), source, effect)


# --- breaker ---------------------------------------------------------------------------


async def test_the_breaker_opens_after_failure_threshold_failures(h: Harness) -> None:
    await fail(h, BRITTLE)
    await fail(h, BRITTLE)
    for _ in range(5):
        await fail(h, BRITTLE, Effect.NEUTRAL)  # a 429 or a rejection is not a fault
    snap = await h.snapshot(BRITTLE)
    assert (snap.breaker, snap.breaker_failures) == ("closed", 2)

    await fail(h, BRITTLE)
    assert (await h.snapshot(BRITTLE)).breaker == "open"
    denial = await h.deny(BRITTLE)
    assert denial.blocked == (("brittle", "breaker_open"),)
    assert denial.reopen_in_s == pytest.approx(30.0)
    h.clock.advance(12.0)
    assert (await h.deny(BRITTLE)).reopen_in_s == pytest.approx(18.0)


async def test_only_consecutive_failures_count(h: Harness) -> None:
    await fail(h, BRITTLE)
    await fail(h, BRITTLE)
    await fail(h, BRITTLE, Effect.SUCCESS)
    await fail(h, BRITTLE)
    await fail(h, BRITTLE)
    snap = await h.snapshot(BRITTLE)
    assert (snap.breaker, snap.breaker_failures) == ("closed", 2)
    await h.grant(BRITTLE)


async def open_breaker(h: Harness) -> None:
    for _ in range(3):
        await fail(h, BRITTLE)
    assert (await h.snapshot(BRITTLE)).breaker == "open"


async def test_after_the_cooldown_exactly_one_probe_is_admitted(h: Harness) -> None:
    await open_breaker(h)
    h.clock.advance(30.0)
    probe = await h.grant(BRITTLE)
    assert (await h.snapshot(BRITTLE)).breaker == "half_open"

    for scope in ("s", "another-scope"):  # fleet-wide, whatever the scope
        denial = await h.deny(BRITTLE, scope=scope)
        assert denial.blocked == (("brittle", "probe_in_flight"),)
        assert denial.reopen_in_s is None

    assert await h.settle(probe, BRITTLE, Effect.SUCCESS)
    snap = await h.snapshot(BRITTLE)
    assert (snap.breaker, snap.breaker_failures) == ("closed", 0)
    await h.grant(BRITTLE)
    await h.grant(BRITTLE)


async def test_a_failed_probe_opens_the_breaker_for_another_cooldown(h: Harness) -> None:
    await open_breaker(h)
    h.clock.advance(31.0)
    probe = await h.grant(BRITTLE)
    await h.settle(probe, BRITTLE, Effect.FAILURE)
    assert (await h.snapshot(BRITTLE)).breaker == "open"
    assert (await h.deny(BRITTLE)).reopen_in_s == pytest.approx(30.0)


async def test_a_probe_that_proves_nothing_frees_the_probe_slot(h: Harness) -> None:
    await open_breaker(h)
    h.clock.advance(30.0)
    probe = await h.grant(BRITTLE)
    await h.settle(probe, BRITTLE, Effect.NEUTRAL)  # e.g. the probe got a 429
    await h.grant(BRITTLE)  # the next caller probes
    assert (await h.deny(BRITTLE)).blocked == (("brittle", "probe_in_flight"),)


async def test_rejected_credentials_open_the_breaker_for_the_auth_cooldown(h: Harness) -> None:
    source = SourceTerms("keyed", 5, breaker=BreakerTerms(cooldown_s=30, auth_cooldown_s=600))
    await fail(h, source, Effect.AUTH_FAILURE)  # at once, whatever the failure threshold
    assert (await h.snapshot(source)).breaker == "open"
    denial = await h.deny(source)
    assert denial.blocked == (("keyed", "breaker_open"),)
    assert denial.reopen_in_s == pytest.approx(600.0)
    h.clock.advance(599.0)
    await h.deny(source)
    h.clock.advance(1.0)
    await h.grant(source)


# --- AIMD ------------------------------------------------------------------------------

ADAPTIVE = SourceTerms("adaptive", 4)


async def test_congestion_halves_the_limit_and_success_adds_one_up_to_the_cap(
    h: Harness,
) -> None:
    assert (await h.snapshot(ADAPTIVE)).permit_limit == 4
    grant = await h.grant(ADAPTIVE)
    h.clock.advance(1.0)
    await h.settle(grant, ADAPTIVE, Effect.NEUTRAL, congested=True)  # a 429
    assert (await h.snapshot(ADAPTIVE)).permit_limit == 2

    held = [await h.grant(ADAPTIVE), await h.grant(ADAPTIVE)]
    assert (await h.deny(ADAPTIVE)).blocked == (("adaptive", "at_capacity"),)

    await h.settle(held[0], ADAPTIVE, Effect.SUCCESS)
    assert (await h.snapshot(ADAPTIVE)).permit_limit == 3
    held[0] = await h.grant(ADAPTIVE)
    held.append(await h.grant(ADAPTIVE))
    await h.deny(ADAPTIVE)

    for grant in held:
        await h.settle(grant, ADAPTIVE, Effect.SUCCESS)
    assert (await h.snapshot(ADAPTIVE)).permit_limit == 4  # capped at max_concurrency


async def test_a_timeout_is_congestion_and_a_breaker_failure(h: Harness) -> None:
    grant = await h.grant(ADAPTIVE)
    h.clock.advance(5.0)
    await h.settle(grant, ADAPTIVE, Effect.FAILURE, congested=True)
    snap = await h.snapshot(ADAPTIVE)
    assert (snap.permit_limit, snap.breaker_failures) == (2, 1)


async def test_a_burst_of_congestion_from_one_episode_halves_once(h: Harness) -> None:
    wide = SourceTerms("wide", 8)
    together = [await h.grant(wide), await h.grant(wide), await h.grant(wide)]
    for grant in together:
        h.clock.advance(1.0)
        await h.settle(grant, wide, Effect.NEUTRAL, congested=True)
    assert (await h.snapshot(wide)).permit_limit == 4

    later = await h.grant(wide)  # admitted after the decrease: a new episode
    h.clock.advance(1.0)
    await h.settle(later, wide, Effect.NEUTRAL, congested=True)
    assert (await h.snapshot(wide)).permit_limit == 2


async def test_the_limit_never_drops_below_one(h: Harness) -> None:
    for _ in range(4):
        grant = await h.grant(ADAPTIVE)
        h.clock.advance(1.0)
        await h.settle(grant, ADAPTIVE, Effect.NEUTRAL, congested=True)
    assert (await h.snapshot(ADAPTIVE)).permit_limit == 1
    await h.grant(ADAPTIVE)


async def test_an_initial_limit_starts_below_the_cap(h: Harness) -> None:
    slow_start = SourceTerms("slow", 4, aimd=AimdTerms(initial_limit=1))
    assert (await h.snapshot(slow_start)).permit_limit == 1
    grant = await h.grant(slow_start)
    await h.deny(slow_start)
    await h.settle(grant, slow_start, Effect.SUCCESS)
    assert (await h.snapshot(slow_start)).permit_limit == 2


# --- quotas ----------------------------------------------------------------------------


async def test_sliding_rpm_admits_at_most_rpm_in_any_window(h: Harness) -> None:
    source = SourceTerms("rpm", 10, quota=QuotaTerms("key", rpm=3, rpm_window="sliding"))
    for _ in range(3):
        await h.grant(source)
        h.clock.advance(10.0)
    denial = await h.deny(source)  # at 30 s: three in the window, none refilled evenly
    assert denial.blocked == (("rpm", "quota"),)
    assert denial.reopen_in_s == pytest.approx(WINDOW_S - 30.0)  # when the first leaves
    h.clock.advance(WINDOW_S - 30.0 - 1.0)
    await h.deny(source)
    h.clock.advance(1.0)
    await h.grant(source)
    assert (await h.deny(source)).reopen_in_s == pytest.approx(10.0)  # then the second


async def test_sliding_rpm_spends_a_whole_minute_at_once_after_an_idle_one(h: Harness) -> None:
    source = SourceTerms("rpm", 10, quota=QuotaTerms("key", rpm=4, rpm_window="sliding"))
    for _ in range(4):
        await h.grant(source)
    h.clock.advance(WINDOW_S)
    for _ in range(4):
        await h.grant(source)
    assert (await h.deny(source)).reopen_in_s == pytest.approx(WINDOW_S)


async def test_workers_counting_rpm_as_a_bucket_see_the_sliding_windows_admissions(
    h: Harness,
) -> None:
    sliding = SourceTerms("new", 10, quota=QuotaTerms("key", rpm=3, rpm_window="sliding"))
    bucket = SourceTerms("old", 10, quota=QuotaTerms("key", rpm=3, rpm_window="bucket"))
    for _ in range(3):
        await h.grant(sliding)
    # as if it had admitted the three (the window keeps its own margin): one refills in 20 s
    assert (await h.deny(bucket)).reopen_in_s == pytest.approx(PERIOD_S / 3)


async def test_rpm_as_a_bucket_denies_the_request_over_the_limit_until_it_refills(
    h: Harness,
) -> None:
    source = SourceTerms("rpm", 10, quota=QuotaTerms("key", rpm=3, rpm_window="bucket"))
    for _ in range(2):
        await h.grant(source)
    # the third of a full bucket waits the margin the bucket keeps in hand
    assert (await h.deny(source)).reopen_in_s == pytest.approx(ARRIVAL_MARGIN_S)
    h.clock.advance(ARRIVAL_MARGIN_S)
    await h.grant(source)
    denial = await h.deny(source)
    assert denial.blocked == (("rpm", "quota"),)
    assert denial.reopen_in_s == pytest.approx(PERIOD_S / 3)  # one request refills in 60/3 s
    h.clock.advance(denial.reopen_in_s)
    await h.grant(source)
    await h.deny(source)


async def test_rpm_is_shared_by_sources_with_the_same_quota_name(h: Harness) -> None:
    shared = QuotaTerms("provider-key", rpm=2)
    a = SourceTerms("a", 10, quota=shared)
    b = SourceTerms("b", 10, quota=shared)
    c = SourceTerms("c", 10, quota=QuotaTerms("another-key", rpm=2))
    await h.grant(a)
    h.clock.advance(ARRIVAL_MARGIN_S)  # the second of a full bucket waits the margin
    await h.grant(b)
    assert (await h.deny(a, b)).blocked == (("a", "quota"), ("b", "quota"))
    assert (await h.grant(a, c)).source == "c"


async def test_a_denied_admission_spends_no_quota(h: Harness) -> None:
    source = SourceTerms("narrow", 1, quota=QuotaTerms("key", rpm=2))
    first = await h.grant(source)
    assert (await h.deny(source)).blocked == (("narrow", "at_capacity"),)
    await h.settle(first, source)
    h.clock.advance(ARRIVAL_MARGIN_S)  # the second of a full bucket waits the margin
    second = await h.grant(source)
    await h.settle(second, source)
    assert (await h.deny(source)).blocked == (("narrow", "quota"),)


TOKENS = SourceTerms("tokens", 10, quota=QuotaTerms("tok", tpm=1000))


async def test_tpm_reserves_the_estimate_at_admission(h: Harness) -> None:
    await h.grant(TOKENS, est_tokens=600)
    denial = await h.deny(TOKENS, est_tokens=600)
    assert denial.blocked == (("tokens", "quota"),)
    # 200 tokens over the minute refill in 12 s, and the margin in hand
    assert denial.reopen_in_s == pytest.approx(12.0 + ARRIVAL_MARGIN_S)
    h.clock.advance(ARRIVAL_MARGIN_S)  # the rest of a full bucket waits the margin
    await h.grant(TOKENS, est_tokens=400)
    await h.deny(TOKENS, est_tokens=1)


async def test_tpm_refunds_an_overestimate_at_settlement(h: Harness) -> None:
    grant = await h.grant(TOKENS, est_tokens=1000)
    await h.deny(TOKENS, est_tokens=500)
    await h.settle(grant, TOKENS, est_tokens=1000, used_tokens=400)  # 600 back
    h.clock.advance(ARRIVAL_MARGIN_S)  # the rest of a full bucket waits the margin
    await h.grant(TOKENS, est_tokens=600)
    await h.deny(TOKENS, est_tokens=1)


async def test_tpm_charges_an_underestimate_at_settlement(h: Harness) -> None:
    grant = await h.grant(TOKENS, est_tokens=100)
    await h.settle(grant, TOKENS, est_tokens=100, used_tokens=700)
    h.clock.advance(ARRIVAL_MARGIN_S)  # the rest of a full bucket waits the margin
    await h.grant(TOKENS, est_tokens=300)
    await h.deny(TOKENS, est_tokens=1)


async def test_settling_with_the_estimate_changes_nothing(h: Harness) -> None:
    grant = await h.grant(TOKENS, est_tokens=1000)
    await h.settle(grant, TOKENS, est_tokens=1000, used_tokens=1000)
    await h.deny(TOKENS, est_tokens=1)


async def test_a_failed_settlement_refunds_the_whole_estimate(h: Harness) -> None:
    grant = await h.grant(TOKENS, est_tokens=1000)
    await h.deny(TOKENS, est_tokens=1)
    await h.settle(grant, TOKENS, Effect.FAILURE, est_tokens=1000, used_tokens=0)
    # all of it back: a whole minute's worth again once the margin it was charged ahead passed
    h.clock.advance(ARRIVAL_MARGIN_S)
    await h.grant(TOKENS, est_tokens=1000)


# --- progress --------------------------------------------------------------------------

SOURCE = SourceTerms("src", 10)


async def test_progress_age_is_infinite_before_any_success(h: Harness) -> None:
    assert await h.store.progress_age_s("s") == math.inf
    await fail(h, SOURCE)
    await fail(h, SOURCE, Effect.NEUTRAL)
    assert await h.store.progress_age_s("s") == math.inf


async def test_progress_age_counts_from_the_last_success_of_the_scope(h: Harness) -> None:
    h.clock.advance(100.0)
    grant = await h.grant(SOURCE, scope="x")
    h.clock.advance(5.0)
    await h.settle(grant, SOURCE, Effect.SUCCESS, scope="x")
    assert await h.store.progress_age_s("x") == 0.0
    h.clock.advance(7.5)
    assert await h.store.progress_age_s("x") == pytest.approx(7.5)
    # progress belongs to the scope, not to the source that served it
    assert await h.store.progress_age_s("y") == math.inf

    await fail(h, SOURCE, Effect.FAILURE)  # a failure never resets it
    assert await h.store.progress_age_s("x") == pytest.approx(7.5)
    grant = await h.grant(SOURCE, scope="x")
    await h.settle(grant, SOURCE, Effect.SUCCESS, scope="x")
    assert await h.store.progress_age_s("x") == 0.0


async def test_progress_expires_after_an_hour(h: Harness) -> None:
    grant = await h.grant(SOURCE)
    await h.settle(grant, SOURCE, Effect.SUCCESS)
    h.clock.advance(3599.0)
    assert await h.store.progress_age_s("s") == pytest.approx(3599.0)
    h.clock.advance(2.0)
    assert await h.store.progress_age_s("s") == math.inf


async def test_an_initial_limit_above_the_cap_starts_at_the_cap(h: Harness) -> None:
    capped = SourceTerms("capped", 4, aimd=AimdTerms(initial_limit=100))
    grant = await h.grant(capped)
    await h.settle(grant, capped, Effect.NEUTRAL, congested=True)
    assert (await h.store.snapshot(capped)).permit_limit == 2


async def test_a_settlement_of_a_permit_no_longer_held_keeps_pause_and_progress(
    h: Harness,
) -> None:
    A = SourceTerms("a", 2)
    grant = await h.grant(A)
    assert await h.settle(grant, A, Effect.NEUTRAL)
    assert not await h.settle(grant, A, Effect.NEUTRAL, pause_s=30)
    assert (await h.store.snapshot(A)).paused_for_s == pytest.approx(30)
    assert not await h.settle(grant, A, Effect.SUCCESS, scope="late")
    assert await h.store.progress_age_s("late") == 0
    assert (await h.store.snapshot(A)).breaker_failures == 0


async def test_a_success_on_a_permit_reclaimed_and_granted_again_keeps_what_it_shows(
    h: Harness,
) -> None:
    """A success whose lease lapsed while its answer came (SPEC §3 rule 14): the source
    serves, so its breaker closes and AIMD rises, and the scope progressed; but the
    permit that lapsed may be another call's now, so nothing is released."""
    source = SourceTerms("lapsing", 4, breaker=BreakerTerms(failure_threshold=3))
    await fail(h, source)
    await fail(h, source)
    h.clock.advance(1.0)
    congested = await h.grant(source)
    await h.settle(congested, source, Effect.NEUTRAL, congested=True)  # a 429: limit 4 -> 2
    lapsed = await h.grant(source)  # its lease lapses: the store forgets it ...
    h.clock.advance(1.0)
    assert await h.settle(lapsed, source, Effect.NEUTRAL) is True  # (as a reclaim does)
    holders = [await h.grant(source), await h.grant(source)]  # ... and grants it again
    before = await h.snapshot(source)
    assert (before.breaker_failures, before.permit_limit, before.permits_in_use) == (2, 2, 2)

    assert await h.settle(lapsed, source, Effect.SUCCESS, scope="late") is False

    after = await h.snapshot(source)
    assert (after.breaker, after.breaker_failures) == ("closed", 0)
    assert after.permit_limit == 3
    assert after.permits_in_use == 2  # the holders' permits stay theirs
    assert await h.store.progress_age_s("late") == 0
    for holder in holders:
        assert await h.settle(holder, source) is True


async def test_a_failure_on_a_permit_no_longer_held_counts_nothing(h: Harness) -> None:
    source = SourceTerms("lapsing", 4, breaker=BreakerTerms(failure_threshold=3))
    await fail(h, source)
    grant = await h.grant(source)
    assert await h.settle(grant, source, Effect.NEUTRAL)
    h.clock.advance(1.0)
    assert not await h.settle(grant, source, Effect.FAILURE, congested=True)
    after = await h.snapshot(source)
    assert (after.breaker_failures, after.permit_limit, after.permits_in_use) == (1, 4, 0)
