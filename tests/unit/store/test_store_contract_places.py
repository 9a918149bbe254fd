"""Store contract: waiting calls keep their places in the queues (`Store.keep_places`).

A call refused for capacity alone waits in the source's queue while its claim lasts;
`keep_places` renews the claims of many waiting calls in one operation, so they need
not ask again to stay in line, and says which no longer wait there (handed a permit,
claim ended, the source paused or its breaker not closed). A source that can run a
call while its queue is not empty hands a permit to its first live waiter.
"""

from __future__ import annotations

from polygate_celery.core.breaker import Effect
from polygate_celery.core.terms import BreakerTerms, SourceTerms
from tests.unit.store.conftest import Harness

ONE = SourceTerms("one", max_concurrency=1)
TWO = SourceTerms("two", max_concurrency=1)
CLAIM_S = 3.0


async def test_a_kept_place_outlives_its_first_claim(h: Harness) -> None:
    held = await h.grant(ONE)
    await h.deny(ONE, waiter="kept", claim_s=CLAIM_S)
    await h.deny(ONE, waiter="idle", claim_s=CLAIM_S)  # never renewed
    h.clock.advance(2.5)
    assert await h.store.keep_places([(ONE, "kept", CLAIM_S)]) == [True]
    h.clock.advance(2.5)  # 5 s after both queued: only "kept" still claims its place
    with (
        h.store.watch_releases(["one"], "kept") as kept,
        h.store.watch_releases(["one"], "idle") as idle,
    ):
        await h.settle(held, ONE)
        await h.turns()
        assert kept.woken_by == "one"
        assert idle.woken_by is None
    await h.grant(ONE, waiter="kept")


async def test_a_place_passed_over_is_not_kept(h: Harness) -> None:
    """A claim that ran out is renewed while nobody passed it over (its caller lives: the
    renewal came late); once a release passed it over, the place is gone."""
    held = await h.grant(ONE)
    await h.deny(ONE, waiter="late", claim_s=CLAIM_S)
    await h.deny(ONE, waiter="gone", claim_s=CLAIM_S)
    await h.deny(ONE, waiter="next", claim_s=CLAIM_S)
    h.clock.advance(CLAIM_S + 0.5)
    assert await h.store.keep_places([(ONE, "late", CLAIM_S)]) == [True]
    h.clock.advance(0.5)
    assert await h.store.keep_places([(ONE, "next", CLAIM_S)]) == [True]
    with h.store.watch_releases(["one"], "next") as watch:
        await h.settle(held, ONE)  # "late" is first: handed the permit
        assert await h.store.keep_places([(ONE, "late", CLAIM_S)]) == [False]
        await h.settle(await h.grant(ONE, waiter="late"), ONE)  # "gone"'s claim ran out
        await h.turns()
        assert watch.woken_by == "one"  # "gone" was passed over
    assert await h.store.keep_places([(ONE, "gone", CLAIM_S)]) == [False]
    assert await h.store.keep_places([(ONE, "never-queued", CLAIM_S)]) == [False]


async def test_a_call_handed_a_permit_is_told_to_ask_again(h: Harness) -> None:
    """Its wake-up may have been lost (a message sent before its process subscribed):
    keeping its place then tells it the permit is there."""
    held = await h.grant(ONE)
    await h.deny(ONE, waiter="w", claim_s=CLAIM_S)
    await h.settle(held, ONE)  # handed to "w"
    h.clock.advance(0.5)
    assert await h.store.keep_places([(ONE, "w", CLAIM_S)]) == [False]
    await h.grant(ONE, waiter="w")


async def test_places_at_a_paused_or_broken_source_are_not_kept(h: Harness) -> None:
    """There the call asks again: its admission says why, and it polls."""
    brittle = SourceTerms("brittle", 1, breaker=BreakerTerms(failure_threshold=1))
    held = await h.grant(ONE)
    await h.deny(ONE, waiter="w", claim_s=CLAIM_S)
    await h.store.pause_source("one", 10.0)
    h.clock.advance(0.5)  # (a renewal in the same instant would change nothing)
    assert await h.store.keep_places([(ONE, "w", CLAIM_S)]) == [False]
    await h.settle(held, ONE)

    failing = await h.grant(brittle)
    await h.deny(brittle, waiter="v", claim_s=CLAIM_S)
    await h.settle(failing, brittle, Effect.FAILURE)  # the breaker opens
    h.clock.advance(0.5)
    assert await h.store.keep_places([(brittle, "v", CLAIM_S)]) == [False]


async def test_places_are_answered_in_order_across_sources(h: Harness) -> None:
    await h.grant(ONE)
    await h.grant(TWO)
    await h.deny(ONE, TWO, waiter="both", claim_s=CLAIM_S)
    await h.deny(TWO, waiter="two-only", claim_s=CLAIM_S)
    h.clock.advance(1.0)
    places = [(ONE, "both", CLAIM_S), (TWO, "absent", CLAIM_S), (TWO, "both", CLAIM_S)]
    assert await h.store.keep_places([*places, (TWO, "two-only", CLAIM_S)]) == [
        True,
        False,
        True,
        True,
    ]


async def test_a_permit_freed_without_a_release_goes_to_the_first_kept_waiter(
    h: Harness,
) -> None:
    """A permit handed to a waiter that died comes back when its claim ends; nobody
    releases it, so keeping the places of those still waiting hands it on."""
    held = await h.grant(ONE)
    await h.deny(ONE, waiter="dead", claim_s=CLAIM_S)
    await h.deny(ONE, waiter="live", claim_s=CLAIM_S)
    await h.settle(held, ONE)  # handed to "dead", which never asks again
    with h.store.watch_releases(["one"], "live") as live:
        for _ in range(2):
            h.clock.advance(2.0)
            assert await h.store.keep_places([(ONE, "live", CLAIM_S)]) == [True]
        await h.turns()
        assert live.woken_by == "one"  # "dead"'s claim ended 1 s ago
    await h.grant(ONE, waiter="live")
