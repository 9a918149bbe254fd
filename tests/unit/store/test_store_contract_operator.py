"""Store contract, part 3: an operator's steps (resume, reset) and the status views' reads.

`resume_source` and `reset_source` are what `polygate-celery source resume|reset`
run fleet-wide; `gate_closed_for_s` and `quota_snapshot` are read-only and feed
`polygate-celery status`. Written against the protocol only, in virtual time.
"""

from __future__ import annotations

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.quota import ARRIVAL_MARGIN_S, WINDOW_S
from polygate_celery.core.terms import AimdTerms, BreakerTerms, QuotaTerms, SourceTerms
from tests.unit.store.conftest import Harness

SRC = SourceTerms(
    "src", 4, breaker=BreakerTerms(failure_threshold=2, cooldown_s=30), aimd=AimdTerms()
)
SLOW_START = SourceTerms("slow", 8, aimd=AimdTerms(initial_limit=2))


async def congest(h: Harness, source: SourceTerms) -> None:
    grant = await h.grant(source)
    h.clock.advance(1.0)
    await h.settle(grant, source, Effect.NEUTRAL, congested=True)


# --- resume ----------------------------------------------------------------------------


async def test_resume_lifts_a_pause_at_once(h: Harness) -> None:
    await h.store.pause_source("src", 600.0)
    assert (await h.deny(SRC)).blocked == (("src", "paused"),)
    await h.store.resume_source("src")
    assert (await h.snapshot(SRC)).paused_for_s == 0.0
    await h.grant(SRC)


async def test_resume_leaves_the_breaker_and_the_limit_alone(h: Harness) -> None:
    await congest(h, SRC)
    for _ in range(2):
        await h.settle(await h.grant(SRC), SRC, Effect.FAILURE)
    await h.store.resume_source("src")
    snap = await h.snapshot(SRC)
    assert (snap.breaker, snap.permit_limit) == ("open", 2)


async def test_resume_of_a_source_never_seen_is_harmless(h: Harness) -> None:
    await h.store.resume_source("unknown")
    assert (await h.snapshot(SourceTerms("unknown", 3))).paused_for_s == 0.0


async def test_a_pause_after_a_resume_holds_again(h: Harness) -> None:
    await h.store.pause_source("src", 600.0)
    await h.store.resume_source("src")
    await h.store.pause_source("src", 5.0)  # not kept back by the lifted, later pause
    assert (await h.snapshot(SRC)).paused_for_s == pytest.approx(5.0)


# --- reset -----------------------------------------------------------------------------


async def test_reset_closes_the_breaker_and_clears_its_failures(h: Harness) -> None:
    for _ in range(2):
        await h.settle(await h.grant(SRC), SRC, Effect.FAILURE)
    assert (await h.deny(SRC)).blocked == (("src", "breaker_open"),)
    await h.store.reset_source("src")
    snap = await h.snapshot(SRC)
    assert (snap.breaker, snap.breaker_failures) == ("closed", 0)
    await h.grant(SRC)


async def test_reset_brings_the_limit_back_to_its_initial_value(h: Harness) -> None:
    await congest(h, SRC)
    assert (await h.snapshot(SRC)).permit_limit == 2
    await h.store.reset_source("src")
    assert (await h.snapshot(SRC)).permit_limit == 4  # the cap: no initial_limit

    for _ in range(3):
        await h.settle(await h.grant(SLOW_START), SLOW_START, Effect.SUCCESS)
    assert (await h.snapshot(SLOW_START)).permit_limit == 5
    await h.store.reset_source("slow")
    assert (await h.snapshot(SLOW_START)).permit_limit == 2


async def test_reset_starts_a_new_congestion_episode(h: Harness) -> None:
    held = await h.grant(SRC)  # admitted before the reset
    await congest(h, SRC)
    await h.store.reset_source("src")
    h.clock.advance(1.0)
    await h.settle(held, SRC, Effect.NEUTRAL, congested=True)
    assert (await h.snapshot(SRC)).permit_limit == 2  # the reset forgot the last decrease


async def test_reset_lifts_a_pause_and_keeps_the_permits_held(h: Harness) -> None:
    held = await h.grant(SRC)
    await h.store.pause_source("src", 60.0)
    await h.store.reset_source("src")
    snap = await h.snapshot(SRC)
    assert (snap.paused_for_s, snap.permits_in_use) == (0.0, 1)
    assert await h.settle(held, SRC, Effect.SUCCESS)
    assert (await h.snapshot(SRC)).permits_in_use == 0


async def test_reset_during_a_probe_lets_the_probe_settle(h: Harness) -> None:
    for _ in range(2):
        await h.settle(await h.grant(SRC), SRC, Effect.FAILURE)
    h.clock.advance(30.0)
    probe = await h.grant(SRC)
    assert (await h.snapshot(SRC)).breaker == "half_open"
    await h.store.reset_source("src")
    await h.grant(SRC)  # closed: no probe slot to wait for
    assert await h.settle(probe, SRC, Effect.FAILURE)
    snap = await h.snapshot(SRC)
    assert (snap.breaker, snap.breaker_failures) == ("closed", 1)


# --- reads for status views ------------------------------------------------------------


async def test_the_gate_reads_open_until_closed_then_counts_down(h: Harness) -> None:
    assert await h.store.gate_closed_for_s("s") == 0.0
    await h.store.close_gate("s", 40.0)
    assert await h.store.gate_closed_for_s("s") == pytest.approx(40.0)
    h.clock.advance(15.0)
    assert await h.store.gate_closed_for_s("s") == pytest.approx(25.0)
    assert await h.store.gate_closed_for_s("another") == 0.0
    h.clock.advance(30.0)
    assert await h.store.gate_closed_for_s("s") == 0.0


async def test_a_success_reads_as_an_open_gate(h: Harness) -> None:
    await h.store.close_gate("s", 40.0)
    await h.settle(await h.grant(SRC), SRC, Effect.SUCCESS)
    assert await h.store.gate_closed_for_s("s") == 0.0


async def test_quota_use_counts_what_the_bucket_has_spent(h: Harness) -> None:
    quota = QuotaTerms("key", rpm=60, tpm=1000, rpm_window="bucket")
    source = SourceTerms("q", 10, quota=quota)
    idle = await h.store.quota_snapshot(quota)
    assert (idle.name, idle.requests_used, idle.tokens_used) == ("key", 0.0, 0.0)

    for _ in range(3):
        await h.grant(source, est_tokens=100)
    used = await h.store.quota_snapshot(quota)
    assert used.requests_used == pytest.approx(3.0)
    assert used.tokens_used == pytest.approx(300.0)

    h.clock.advance(1.5)  # 60 rpm refills one request a second, 1,000 tpm 25 tokens
    used = await h.store.quota_snapshot(quota)
    assert used.requests_used == pytest.approx(1.5)
    assert used.tokens_used == pytest.approx(275.0)
    h.clock.advance(60.0)
    assert (await h.store.quota_snapshot(quota)).requests_used == 0.0


async def test_quota_use_counts_the_requests_in_the_sliding_window(h: Harness) -> None:
    quota = QuotaTerms("key", rpm=60, rpm_window="sliding")
    source = SourceTerms("q", 10, quota=quota)
    for _ in range(3):
        await h.grant(source)
        h.clock.advance(10.0)
    assert (await h.store.quota_snapshot(quota)).requests_used == 3.0  # at 30 s: all in it
    h.clock.advance(WINDOW_S - 30.0)  # the first leaves one window after its admission
    assert (await h.store.quota_snapshot(quota)).requests_used == 2.0
    h.clock.advance(20.0)
    assert (await h.store.quota_snapshot(quota)).requests_used == 0.0


async def test_quota_use_shows_only_the_configured_dimensions(h: Harness) -> None:
    quota = QuotaTerms("rpm-only", rpm=10)
    await h.grant(SourceTerms("r", 10, quota=quota), est_tokens=50)
    snap = await h.store.quota_snapshot(quota)
    assert snap.requests_used == pytest.approx(1.0)
    assert snap.tokens_used is None


async def test_reading_quota_use_spends_nothing(h: Harness) -> None:
    quota = QuotaTerms("narrow", rpm=2)
    source = SourceTerms("n", 10, quota=quota)
    await h.grant(source)
    for _ in range(5):
        await h.store.quota_snapshot(quota)
    h.clock.advance(ARRIVAL_MARGIN_S)  # the second of a full bucket waits the margin
    await h.grant(source)
    await h.deny(source)
