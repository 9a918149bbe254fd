"""Store contract, part 1: permits, candidate order, pauses, reopen times and release wake-ups.

Written against the protocol only (SPEC §5), so every store implementation in
`store_factory` must pass it unchanged.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.quota import ARRIVAL_MARGIN_S
from polygate_celery.core.terms import BreakerTerms, QuotaTerms, SourceTerms
from polygate_celery.store import AdmitRequest, Denial, Grant, Store
from tests.unit.store.conftest import Harness

A = SourceTerms("a", max_concurrency=2)
B = SourceTerms("b", max_concurrency=2)
ONE = SourceTerms("one", max_concurrency=1)


def test_every_factory_builds_a_store(store: Store) -> None:
    assert isinstance(store, Store)


# --- permits ---------------------------------------------------------------------------


async def test_permits_are_granted_up_to_max_concurrency(h: Harness) -> None:
    first = await h.grant(A)
    second = await h.grant(A)
    assert (first.source, second.source) == ("a", "a")
    assert first.permit_id != second.permit_id
    assert (await h.snapshot(A)).permits_in_use == 2

    denial = await h.deny(A)
    assert denial.blocked == (("a", "at_capacity"),)
    assert denial.reopen_in_s is None  # capacity has no known end
    assert (await h.snapshot(A)).permits_in_use == 2


async def test_a_grant_carries_the_permit_id_and_the_store_time(h: Harness) -> None:
    h.clock.advance(42.0)
    grant = await h.grant(A, permit_id="mine")
    assert grant.permit_id == "mine"
    assert grant.admitted_at == pytest.approx(42.0)


async def test_settle_releases_the_permit_once(h: Harness) -> None:
    grant = await h.grant(ONE)
    await h.deny(ONE)
    assert await h.settle(grant, ONE) is True
    assert (await h.snapshot(ONE)).permits_in_use == 0
    assert await h.settle(grant, ONE) is False  # already released
    assert (await h.snapshot(ONE)).permits_in_use == 0
    await h.grant(ONE)


async def test_a_failed_settlement_releases_the_permit_too(h: Harness) -> None:
    grant = await h.grant(ONE)
    assert await h.settle(grant, ONE, Effect.FAILURE) is True
    await h.grant(ONE)


async def test_settling_an_unknown_permit_returns_false(h: Harness) -> None:
    held = await h.grant(A)
    ghost = Grant("a", "never-admitted", held.admitted_at)
    assert await h.settle(ghost, A) is False
    assert (await h.snapshot(A)).permits_in_use == 1


async def test_a_repeated_admit_with_the_same_permit_id_is_idempotent(h: Harness) -> None:
    first = await h.grant(ONE, permit_id="p")
    again = await h.grant(ONE, permit_id="p")  # not "at_capacity": it is the same permit
    assert (again.source, again.permit_id) == ("one", "p")
    assert (await h.snapshot(ONE)).permits_in_use == 1
    assert await h.settle(first, ONE) is True
    assert await h.settle(again, ONE) is False
    assert (await h.snapshot(ONE)).permits_in_use == 0


async def test_a_repeated_admit_returns_its_grant_whatever_happened_since(h: Harness) -> None:
    first = await h.grant(A, permit_id="p")
    await h.store.pause_source("a", 30)
    assert (await h.grant(A, permit_id="p")).permit_id == "p"  # paused since
    await h.store.resume_source("a")
    await h.store.close_gate("s", 30)
    gated = AdmitRequest("s", (A,), "p", gate=True, call_id="other", probe_lease_s=60)
    assert isinstance(await h.store.admit(gated), Grant)  # gated since
    assert isinstance(await h.store.admit(replace(gated, permit_id="q", call_id="c")), Grant)
    assert (await h.snapshot(A)).permits_in_use == 2  # "p" took neither the probe nor a permit
    assert await h.settle(first, A) is True


async def test_a_caller_in_no_queue_may_say_so(h: Harness) -> None:
    """`queued=False` (not refused since its last grant) changes no answer."""
    request = AdmitRequest("s", (ONE,), "p", call_id="w", claim_s=3.0, queued=False)
    assert isinstance(await h.store.admit(request), Grant)
    assert isinstance(await h.store.admit(request), Grant)  # repeated: its first grant
    assert isinstance(await h.store.admit(replace(request, permit_id="q")), Denial)
    assert (await h.snapshot(ONE)).permits_in_use == 1


async def test_a_repeated_admit_keeps_its_source_when_a_better_one_reopens(h: Harness) -> None:
    blocker = await h.grant(ONE)
    first = await h.grant(ONE, A, permit_id="p")
    assert first.source == "a"
    await h.settle(blocker, ONE)  # the preferred candidate is runnable again

    again = await h.grant(ONE, A, permit_id="p")
    assert again.source == "a"  # the permit it already holds, not a second one
    assert (await h.snapshot(ONE)).permits_in_use == 0
    assert (await h.snapshot(A)).permits_in_use == 1


# --- candidate order -------------------------------------------------------------------


async def test_the_first_runnable_candidate_wins(h: Harness) -> None:
    assert (await h.grant(A, B)).source == "a"
    assert (await h.grant(B, A)).source == "b"


async def test_a_blocked_first_candidate_falls_through_to_the_second(h: Harness) -> None:
    await h.grant(ONE)
    assert (await h.grant(ONE, B)).source == "b"
    await h.store.pause_source("b", 10.0)
    assert (await h.grant(B, A)).source == "a"


async def test_a_denial_names_every_candidate_and_its_reason(h: Harness) -> None:
    await h.grant(ONE)
    await h.store.pause_source("b", 10.0)
    denial = await h.deny(ONE, B)
    assert dict(denial.blocked) == {"one": "at_capacity", "b": "paused"}


# --- pauses ----------------------------------------------------------------------------


async def test_a_paused_source_is_denied_until_the_pause_ends(h: Harness) -> None:
    await h.store.pause_source("a", 30.0)
    assert (await h.snapshot(A)).paused_for_s == pytest.approx(30.0)
    denial = await h.deny(A)
    assert denial.blocked == (("a", "paused"),)
    assert denial.reopen_in_s == pytest.approx(30.0)

    h.clock.advance(29.0)
    assert (await h.deny(A)).reopen_in_s == pytest.approx(1.0)
    h.clock.advance(1.0)
    await h.grant(A)
    assert (await h.snapshot(A)).paused_for_s == 0.0


async def test_a_pause_keeps_the_later_deadline(h: Harness) -> None:
    await h.store.pause_source("a", 30.0)
    await h.store.pause_source("a", 10.0)  # never shortens
    assert (await h.snapshot(A)).paused_for_s == pytest.approx(30.0)
    await h.store.pause_source("a", 60.0)  # lengthens
    assert (await h.snapshot(A)).paused_for_s == pytest.approx(60.0)


async def test_a_settlement_pause_keeps_the_later_deadline(h: Harness) -> None:
    grant = await h.grant(A)
    await h.store.pause_source("a", 50.0)
    await h.settle(grant, A, Effect.NEUTRAL, congested=True, pause_s=20.0)
    assert (await h.snapshot(A)).paused_for_s == pytest.approx(50.0)

    grant = await h.grant(B)
    await h.settle(grant, B, Effect.NEUTRAL, congested=True, pause_s=20.0)
    assert (await h.snapshot(B)).paused_for_s == pytest.approx(20.0)
    assert (await h.deny(B)).reopen_in_s == pytest.approx(20.0)


async def test_a_pause_belongs_to_the_source_in_every_scope(h: Harness) -> None:
    await h.store.pause_source("a", 5.0)
    assert (await h.deny(A, scope="x")).blocked == (("a", "paused"),)
    assert (await h.deny(A, scope="y")).blocked == (("a", "paused"),)


# --- reopen_in_s -----------------------------------------------------------------------


async def test_reopen_is_the_soonest_known_reopening(h: Harness) -> None:
    fragile = SourceTerms("fragile", 2, breaker=BreakerTerms(failure_threshold=1, cooldown_s=30))
    limited = SourceTerms("limited", 5, quota=QuotaTerms("k", rpm=1))
    grant = await h.grant(fragile)
    await h.settle(grant, fragile, Effect.FAILURE)  # breaker open for 30 s
    await h.grant(limited)  # quota spent; refills in 60 s
    await h.store.pause_source("a", 45.0)

    denial = await h.deny(A, fragile, limited)
    assert dict(denial.blocked) == {"a": "paused", "fragile": "breaker_open", "limited": "quota"}
    assert denial.reopen_in_s == pytest.approx(30.0)

    h.clock.advance(20.0)  # every known end comes 20 s closer, whatever the order asked
    assert (await h.deny(limited, A, fragile)).reopen_in_s == pytest.approx(10.0)


async def test_reopen_can_be_a_quota_refill_or_a_pause(h: Harness) -> None:
    limited = SourceTerms("limited", 5, quota=QuotaTerms("k", rpm=2, rpm_window="bucket"))
    await h.grant(limited)
    h.clock.advance(ARRIVAL_MARGIN_S)  # the second of a full bucket waits the margin
    await h.grant(limited)  # the next request conforms in 30 s
    await h.store.pause_source("a", 45.0)
    assert (await h.deny(A, limited)).reopen_in_s == pytest.approx(30.0)
    await h.store.pause_source("b", 7.0)
    assert (await h.deny(A, limited, B)).reopen_in_s == pytest.approx(7.0)


async def test_reopen_ignores_blockers_without_a_known_end(h: Harness) -> None:
    await h.grant(ONE)
    await h.store.pause_source("b", 12.0)
    denial = await h.deny(ONE, B)
    assert denial.reopen_in_s == pytest.approx(12.0)


async def test_reopen_is_none_when_only_capacity_blocks(h: Harness) -> None:
    await h.grant(ONE)
    await h.grant(B)
    await h.grant(B)
    denial = await h.deny(ONE, B)
    assert dict(denial.blocked) == {"one": "at_capacity", "b": "at_capacity"}
    assert denial.reopen_in_s is None


# --- watch_releases ---------------------------------------------------------------------


async def test_a_watch_fires_when_a_named_source_releases(h: Harness) -> None:
    held_a = await h.grant(A)
    held_b = await h.grant(B)
    other = SourceTerms("other", 2)
    held_other = await h.grant(other)

    with h.store.watch_releases(["a", "b"]) as watch:
        waiter = asyncio.create_task(watch.wait())
        await h.turns()
        assert not waiter.done()

        await h.settle(held_other, other)  # not one of the named sources
        await h.turns()
        assert not waiter.done()

        await h.settle(held_b, B)
        await h.turns()
        assert waiter.done()
        await waiter
    await h.settle(held_a, A)


async def test_a_release_before_waiting_is_not_missed(h: Harness) -> None:
    """The watch starts when created: a release before `wait()` still counts."""
    held = await h.grant(ONE)
    with h.store.watch_releases(["one"]) as watch:
        assert isinstance(await h.admit(ONE), Denial)
        await h.settle(held, ONE)  # released before anyone waits
        await asyncio.wait_for(watch.wait(), timeout=1)


async def test_one_release_wakes_the_oldest_watch_only(h: Harness) -> None:
    """Waking every waiter for one permit would only make the rest be refused again."""
    first, second = await h.grant(A), await h.grant(A)
    watches = [h.store.watch_releases(["a"]) for _ in range(3)]
    waiters = [asyncio.create_task(w.wait()) for w in watches]
    await h.turns()
    await h.settle(first, A, Effect.FAILURE)
    await h.turns()
    assert [w.done() for w in waiters] == [True, False, False]
    await h.settle(second, A)
    await h.turns()
    assert [w.done() for w in waiters] == [True, True, False]
    for watch in watches:
        watch.__exit__(None, None, None)
    waiters[2].cancel()


async def test_an_unused_wake_up_is_handed_to_the_next_watch(h: Harness) -> None:
    """A watch woken while its caller got a permit anyway passes the wake-up on."""
    held = await h.grant(A)
    lucky = h.store.watch_releases(["a"])
    with h.store.watch_releases(["a"]) as next_in_line:
        waiter = asyncio.create_task(next_in_line.wait())
        await h.settle(held, A)  # wakes `lucky` first
        await h.turns()
        assert not waiter.done()
        lucky.__exit__(None, None, None)  # closed without waiting: hand it on
        await h.turns()
        assert waiter.done()


async def test_a_closed_watch_does_not_disturb_other_watches(h: Harness) -> None:
    held = await h.grant(A)
    with h.store.watch_releases(["a"]):
        pass
    with h.store.watch_releases(["a"]) as kept:
        waiter = asyncio.create_task(kept.wait())
        await h.settle(held, A)
        await h.turns()
        assert waiter.done()


async def test_a_denial_is_not_a_release(h: Harness) -> None:
    await h.grant(ONE)
    with h.store.watch_releases(["one"]) as watch:
        waiter = asyncio.create_task(watch.wait())
        await h.turns()
        assert isinstance(await h.admit(ONE), Denial)
        await h.turns()
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter


# --- queued waiters: a release hands its permit to the first -------------------------------


async def test_a_release_hands_its_permit_to_the_first_waiter(h: Harness) -> None:
    held = await h.grant(ONE)
    with h.store.watch_releases(["one"], "w1") as watch:
        assert (await h.deny(ONE, waiter="w1")).blocked == (("one", "at_capacity"),)
        waiter = asyncio.create_task(watch.wait())
        await h.settle(held, ONE)
        await h.turns()
        assert waiter.done()
        # held for the waiter: a newcomer (or one that does not queue) is refused
        assert (await h.deny(ONE)).blocked == (("one", "at_capacity"),)
        assert (await h.deny(ONE, waiter="late")).blocked == (("one", "at_capacity"),)
        granted = await h.grant(ONE, waiter="w1")
    assert granted.source == "one"
    assert (await h.snapshot(ONE)).permits_in_use == 1


async def test_waiters_are_served_in_arrival_order(h: Harness) -> None:
    held = [await h.grant(A), await h.grant(A)]
    order = ["w1", "w2", "w3"]
    watches = {w: h.store.watch_releases(["a"], w) for w in order}
    for w in order:
        await h.deny(A, waiter=w)
    await h.deny(A, waiter="w1")  # asking again keeps its place
    woken: list[str] = []
    for permit in held:
        await h.settle(permit, A)
        await h.turns()
        woken += [w for w, watch in watches.items() if watch.woken_by and w not in woken]
    assert woken == ["w1", "w2"]
    assert isinstance(await h.admit(A, waiter="w3"), Denial)  # still waiting
    for w in ("w1", "w2"):
        await h.grant(A, waiter=w)
    for watch in watches.values():
        watch.__exit__(None, None, None)


async def test_a_handed_permit_returns_when_its_claim_ends(h: Harness) -> None:
    """A waiter that died after queueing holds nothing past its claim."""
    held = await h.grant(ONE)
    await h.deny(ONE, waiter="dead", claim_s=3.0)
    await h.settle(held, ONE)  # handed to "dead", which never asks again
    assert isinstance(await h.admit(ONE), Denial)
    h.clock.advance(3.0)
    await h.grant(ONE)


async def test_a_waiter_whose_claim_ended_is_passed_over(h: Harness) -> None:
    held = await h.grant(ONE)
    await h.deny(ONE, waiter="gone", claim_s=3.0)
    h.clock.advance(2.0)
    await h.deny(ONE, waiter="live", claim_s=3.0)
    h.clock.advance(1.5)  # "gone" stopped asking 3.5 s ago; "live" 1.5 s ago
    with h.store.watch_releases(["one"], "live") as watch:
        await h.settle(held, ONE)
        await h.turns()
        assert watch.woken_by == "one"
    await h.grant(ONE, waiter="live")


async def test_a_waiter_granted_elsewhere_hands_its_other_permit_on(h: Harness) -> None:
    held_a, held_b = await h.grant(ONE), await h.grant(SourceTerms("two", 1))
    two = SourceTerms("two", 1)
    await h.deny(ONE, two, waiter="w1")  # queued on both
    await h.deny(two, waiter="w2")
    with h.store.watch_releases(["two"], "w2") as second:
        await h.settle(held_b, two)  # handed to w1
        await h.settle(held_a, ONE)  # w1 is also first on "one": handed that too
        assert (await h.grant(ONE, two, waiter="w1")).source == "one"  # its first choice
        await h.turns()
        assert second.woken_by == "two"  # the permit w1 left on "two" went on to w2
    assert (await h.grant(two, waiter="w2")).source == "two"


async def test_a_caller_granted_at_once_does_not_queue(h: Harness) -> None:
    granted = await h.grant(ONE, waiter="w1")
    await h.settle(granted, ONE)
    await h.grant(ONE)  # nobody was queued: the permit is free
