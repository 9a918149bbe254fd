"""Store contract: callers waiting for a quota book their slots, and are served in turn.

A waiting caller (a call id, a claim, `book_within_s`) refused by quota buckets alone
books the soonest slot they give; the quota is charged for it then, and from the slot
on the caller is admitted without a second charge. Callers are so served in the order
they booked, one per refill, and each asks twice in all (the refusal that booked, the
admission at its slot), instead of all asking again at every refill.
"""

from __future__ import annotations

import pytest

from polygate_celery.core.quota import BURST_S
from polygate_celery.core.standing import Standing
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store import Denial, Grant
from tests.unit.store.conftest import Harness

RPM = SourceTerms("rpm", 10, quota=QuotaTerms("key", rpm=60))  # a bucket: one a second
WITHIN = {"book_within_s": 300.0}


async def drain(h: Harness, source: SourceTerms) -> Denial:
    """Spend the bucket's burst with calls that do not wait (each settled at once); the
    first refusal."""
    while True:
        answer = await h.admit(source)
        if isinstance(answer, Denial):
            return answer
        await h.settle(answer, source)


async def test_waiting_callers_book_consecutive_slots_in_the_order_they_asked(
    h: Harness,
) -> None:
    first = await drain(h, RPM)
    assert first.booked_in_s is None  # a caller that does not wait books nothing
    assert first.reopen_in_s is not None
    slots = []
    for caller in ("a", "b", "c"):
        denial = await h.deny(RPM, waiter=caller, **WITHIN)
        assert denial.blocked == (("rpm", "quota"),)
        assert denial.booked_in_s is not None
        assert denial.reopen_in_s == pytest.approx(denial.booked_in_s)
        slots.append(denial.booked_in_s)
    assert slots[0] == pytest.approx(first.reopen_in_s)
    assert slots[1] == pytest.approx(slots[0] + 1.0)
    assert slots[2] == pytest.approx(slots[1] + 1.0)
    # each at its slot, in turn; before it, the next is refused and told its slot again
    h.clock.advance(slots[0])
    assert isinstance(await h.admit(RPM, waiter="a", **WITHIN), Grant)
    again = await h.deny(RPM, waiter="b", **WITHIN)
    assert again.booked_in_s == pytest.approx(1.0)
    h.clock.advance(1.0)
    assert isinstance(await h.admit(RPM, waiter="b", **WITHIN), Grant)
    h.clock.advance(1.0)
    assert isinstance(await h.admit(RPM, waiter="c", **WITHIN), Grant)


async def test_a_call_asking_again_keeps_its_place_before_later_calls(h: Harness) -> None:
    """First come, first served within a class: a call granted at once whose attempt
    failed (it asks again, at its arrival) takes the soonest slot a later call booked;
    that call, robbed, is booked the next later call's at once, and the last a new one,
    each told its new slot (so none asks at its old one to learn it). An earlier call's
    slot is never taken."""
    early = await h.grant(RPM, waiter="early", **WITHIN)  # the burst's first: it arrived first
    await h.settle(early, RPM)
    await drain(h, RPM)
    slot = {}  # caller -> its slot, on the clock
    for caller in ("a", "b"):
        h.clock.advance(0.01)  # each comes later
        slot[caller] = h.clock.now() + (await h.deny(RPM, waiter=caller, **WITHIN)).booked_in_s
    assert slot["b"] == pytest.approx(slot["a"] + 1.0)
    await h.listening()
    watches = {caller: h.store.watch_releases(["rpm"], caller) for caller in ("a", "b")}
    again = await h.deny(RPM, waiter="early", **WITHIN)  # its attempt failed: it asks again
    assert h.clock.now() + again.booked_in_s == pytest.approx(slot["a"])  # a's slot
    assert h.clock.now() + await h.told(watches["a"]) == pytest.approx(slot["b"])  # b's
    assert h.clock.now() + await h.told(watches["b"]) == pytest.approx(slot["b"] + 1.0)  # new
    h.clock.advance(0.01)
    late = await h.deny(RPM, waiter="late", **WITHIN)  # a newcomer takes no earlier call's
    assert h.clock.now() + late.booked_in_s == pytest.approx(slot["b"] + 2.0)
    h.clock.advance(slot["a"] - h.clock.now())
    assert isinstance(await h.admit(RPM, waiter="early", **WITHIN), Grant)
    for caller in ("a", "b", "late"):  # each at the slot it was told, in turn
        h.clock.advance(1.0)
        assert isinstance(await h.admit(RPM, waiter=caller, **WITHIN), Grant)
    for watch in watches.values():
        watch.__exit__(None, None, None)


async def test_a_robbed_booker_not_told_finds_its_new_slot_when_it_asks(h: Harness) -> None:
    """A booker that missed the message (its process was not listening) asks at its old
    slot and is told the new one then: the booking moved all the same."""
    await drain(h, RPM)
    first = await h.deny(RPM, waiter="b1", standing=BATCH, **WITHIN)
    h.clock.advance(0.01)  # b2 comes later
    await h.deny(RPM, waiter="b2", standing=BATCH, **WITHIN)
    taken = await h.deny(RPM, waiter="i1", standing=INTERACTIVE, **WITHIN)
    assert first.booked_in_s is not None
    assert taken.booked_in_s is not None
    assert taken.booked_in_s == pytest.approx(first.booked_in_s - 0.01)  # b1's
    h.clock.advance(taken.booked_in_s)
    assert isinstance(await h.admit(RPM, waiter="i1", standing=INTERACTIVE, **WITHIN), Grant)
    moved = await h.deny(RPM, waiter="b1", standing=BATCH, **WITHIN)
    assert moved.booked_in_s == pytest.approx(1.0)  # b2's
    h.clock.advance(1.0)
    assert isinstance(await h.admit(RPM, waiter="b1", standing=BATCH, **WITHIN), Grant)
    last = await h.deny(RPM, waiter="b2", standing=BATCH, **WITHIN)
    assert last.booked_in_s == pytest.approx(1.0)  # the next after b1's


async def test_a_later_call_of_its_class_is_taken_when_another_class_is_too_far(
    h: Harness,
) -> None:
    """A slot of another class comes first, but only a slot soon enough: beyond the
    caller's booking horizon, the soonest slot of a later call of its own class is
    taken instead of none."""
    early = await h.grant(RPM, waiter="early", standing=INTERACTIVE, **WITHIN)
    await h.settle(early, RPM)
    h.clock.advance(0.01)  # the others come later
    await drain(h, RPM)
    later = [await h.deny(RPM, waiter=w, standing=INTERACTIVE, **WITHIN) for w in ("i1", "i2")]
    far = await h.deny(RPM, waiter="b1", standing=BATCH, **WITHIN)
    assert far.booked_in_s is not None
    assert later[0].booked_in_s is not None
    assert far.booked_in_s > 2.0 >= later[0].booked_in_s
    again = await h.deny(RPM, waiter="early", standing=INTERACTIVE, book_within_s=2.0)
    assert again.booked_in_s == pytest.approx(later[0].booked_in_s)  # i1's slot


async def test_a_booking_counts_as_an_admission_at_its_slot(h: Harness) -> None:
    first = await drain(h, RPM)
    assert first.reopen_in_s is not None
    booked = await h.deny(RPM, waiter="a", **WITHIN)
    assert booked.booked_in_s == pytest.approx(first.reopen_in_s)
    # a caller that does not book waits for the slot after the booked one
    after = await h.deny(RPM)
    assert after.reopen_in_s == pytest.approx(first.reopen_in_s + 1.0)
    # used at its slot, the booking is not charged again
    h.clock.advance(booked.booked_in_s)
    assert isinstance(await h.admit(RPM, waiter="a", **WITHIN), Grant)
    h.clock.advance(1.0)
    assert isinstance(await h.admit(RPM), Grant)


async def test_no_booking_beyond_the_horizon_and_none_without_one(h: Harness) -> None:
    slow = SourceTerms("slow", 10, quota=QuotaTerms("slow-key", rpm=1))  # one a minute
    await drain(h, slow)
    far = await h.deny(slow, waiter="a", book_within_s=10.0)
    assert far.booked_in_s is None
    assert (await h.deny(slow, waiter="b")).booked_in_s is None  # book_within_s 0
    # nothing was charged: the next booking gets the first slot
    near = await h.deny(slow, waiter="c", **WITHIN)
    assert near.booked_in_s == pytest.approx(far.reopen_in_s)


async def test_a_booking_not_used_lapses_after_its_claim(h: Harness) -> None:
    slow = SourceTerms("slow", 10, quota=QuotaTerms("slow-key", rpm=6))  # one per 10 s
    await drain(h, slow)
    booked = await h.deny(slow, waiter="a", claim_s=3.0, **WITHIN)
    assert booked.booked_in_s is not None
    h.clock.advance(booked.booked_in_s + 3.0 + 0.1)  # its slot, then its claim, passed
    # the lapsed slot stays spent: the next is one interval after it
    after = await h.deny(slow)
    assert after.reopen_in_s == pytest.approx(10.0 - 3.1)
    # "a" asks late: its booking lapsed, so it books afresh, at that next slot
    late = await h.deny(slow, waiter="a", claim_s=3.0, **WITHIN)
    assert late.booked_in_s == pytest.approx(after.reopen_in_s)


async def test_a_booked_caller_refused_for_capacity_keeps_its_paid_slot(h: Harness) -> None:
    narrow = SourceTerms("narrow", 1, quota=QuotaTerms("narrow-key", rpm=60))
    await drain(h, narrow)
    a = await h.deny(narrow, waiter="a", **WITHIN)
    b = await h.deny(narrow, waiter="b", **WITHIN)
    assert a.booked_in_s is not None
    assert b.booked_in_s is not None
    h.clock.advance(b.booked_in_s)  # both slots have come: "a" takes the one permit
    held = await h.grant(narrow, waiter="a", **WITHIN)
    full = await h.deny(narrow, waiter="b", **WITHIN)
    assert full.blocked == (("narrow", "at_capacity"),)
    assert full.booked_in_s is None  # its slot has come: it waits for the permit alone
    h.clock.advance(2.0)  # within its claim (renewed by each ask), past its slot
    await h.deny(narrow, waiter="b", **WITHIN)
    h.clock.advance(2.0)
    await h.deny(narrow, waiter="b", **WITHIN)
    await h.settle(held, narrow)  # the permit is handed to "b": no quota charged again
    assert isinstance(await h.admit(narrow, waiter="b", **WITHIN), Grant)


async def test_tokens_are_booked_with_the_requests(h: Harness) -> None:
    tokens = SourceTerms("tok", 10, quota=QuotaTerms("tok-key", tpm=600))  # 10 a second
    await h.grant(tokens, est_tokens=500)
    booked = await h.deny(tokens, est_tokens=200, waiter="a", **WITHIN)
    # 500 + 200 tokens: the burst of 600 * 59.5 / 60 = 595 is 105 short: 10.5 s
    assert booked.booked_in_s == pytest.approx(700 * 0.1 - BURST_S)
    after = await h.deny(tokens, est_tokens=10)
    assert after.reopen_in_s == pytest.approx(booked.booked_in_s + 1.0)


async def test_a_sliding_window_is_never_booked(h: Harness) -> None:
    sliding = SourceTerms("win", 10, quota=QuotaTerms("win-key", rpm=1, rpm_window="sliding"))
    await h.grant(sliding)
    denial = await h.deny(sliding, waiter="a", **WITHIN)
    assert denial.booked_in_s is None
    assert (await h.deny(sliding, waiter="b", **WITHIN)).reopen_in_s == pytest.approx(
        denial.reopen_in_s
    )


async def test_a_source_refusing_for_more_than_quota_is_not_booked(h: Harness) -> None:
    narrow = SourceTerms("full", 1, quota=QuotaTerms("full-key", rpm=1))
    await h.grant(narrow)  # the one permit, and the minute's request
    denial = await h.deny(narrow, waiter="a", **WITHIN)
    assert denial.blocked == (("full", "at_capacity"),)
    assert denial.booked_in_s is None


INTERACTIVE = Standing(rank=0)
BATCH = Standing(rank=1)


async def test_a_higher_class_takes_the_soonest_slot_a_lower_class_booked(h: Harness) -> None:
    """SPEC §8: among callers waiting for a quota, a higher class is served first. A
    batch backlog has booked the bucket's next slots; an interactive caller takes the
    soonest of them (its quota paid already). The batch caller it was taken from finds
    it gone at its slot and keeps its place in its class: it takes the next batch
    caller's slot, that one the next's, and the last books anew."""
    first = await drain(h, RPM)
    assert first.reopen_in_s is not None
    slot = {}  # caller -> its slot, on the clock
    for waiter in ("b1", "b2", "b3"):
        h.clock.advance(0.01)  # each comes later
        booked = await h.deny(RPM, waiter=waiter, standing=BATCH, **WITHIN)
        slot[waiter] = h.clock.now() + booked.booked_in_s
    assert slot["b2"] == pytest.approx(slot["b1"] + 1.0)
    assert slot["b3"] == pytest.approx(slot["b2"] + 1.0)
    urgent = await h.deny(RPM, waiter="i1", standing=INTERACTIVE, **WITHIN)
    assert h.clock.now() + urgent.booked_in_s == pytest.approx(slot["b1"])  # not a fourth
    h.clock.advance(slot["b1"] - h.clock.now())
    taken = await h.admit(RPM, waiter="i1", standing=INTERACTIVE, **WITHIN)
    assert isinstance(taken, Grant)
    bumped = await h.deny(RPM, waiter="b1", standing=BATCH, **WITHIN)
    assert h.clock.now() + bumped.booked_in_s == pytest.approx(slot["b2"])  # b2's: before it
    h.clock.advance(1.0)
    assert isinstance(await h.admit(RPM, waiter="b1", standing=BATCH, **WITHIN), Grant)
    moved = await h.deny(RPM, waiter="b2", standing=BATCH, **WITHIN)
    assert h.clock.now() + moved.booked_in_s == pytest.approx(slot["b3"])


async def test_a_class_takes_no_slot_from_its_own_class_or_a_higher_one(h: Harness) -> None:
    first = await drain(h, RPM)
    assert first.reopen_in_s is not None
    await h.deny(RPM, waiter="i1", standing=INTERACTIVE, **WITHIN)
    await h.deny(RPM, waiter="b1", standing=BATCH, **WITHIN)
    same = await h.deny(RPM, waiter="b2", standing=BATCH, **WITHIN)
    assert same.booked_in_s == pytest.approx(first.reopen_in_s + 2.0)  # a slot of its own
    # the interactive caller's booking stands: it is admitted at its slot
    h.clock.advance(first.reopen_in_s)
    kept = await h.admit(RPM, waiter="i1", standing=INTERACTIVE, **WITHIN)
    assert isinstance(kept, Grant)


# Interactive and batch, batch's floor half the slots used.
FLOORED = (Standing(rank=0, floors=(0.0, 0.5)), Standing(rank=1, floors=(0.0, 0.5)))


async def booked_by(h: Harness, standing: Standing, *callers: str) -> Denial:
    """The bucket drained, then `callers` of `standing` booking its next slots; the first
    refusal (its reopening: the first slot)."""
    first = await drain(h, RPM)
    assert first.reopen_in_s is not None
    for caller in callers:
        await h.deny(RPM, waiter=caller, standing=standing, **WITHIN)
    return first


async def use(h: Harness, standing: Standing, caller: str) -> None:
    """`caller` books the next slot and is admitted at it (then done): a slot used by its
    class."""
    booked = await h.deny(RPM, waiter=caller, standing=standing, **WITHIN)
    assert booked.booked_in_s is not None
    h.clock.advance(booked.booked_in_s)
    answer = await h.admit(RPM, waiter=caller, standing=standing, **WITHIN)
    assert isinstance(answer, Grant)
    await h.settle(answer, RPM)


async def test_a_class_owed_a_slot_keeps_its_booked_slots(h: Harness) -> None:
    """Batch's floor is half the slots used, and interactive used the last one: batch is
    owed a slot, so an interactive caller leaves batch's booked slots alone and books
    its own after them; once batch has used one, the next takes batch's soonest."""
    interactive, batch = FLOORED
    await drain(h, RPM)
    await use(h, interactive, "i0")
    for caller in ("b1", "b2"):  # the next two slots: 1 and 2 s away
        await h.deny(RPM, waiter=caller, standing=batch, **WITHIN)
    own = await h.deny(RPM, waiter="i1", standing=interactive, **WITHIN)
    assert own.booked_in_s == pytest.approx(3.0)
    h.clock.advance(1.0)
    assert isinstance(await h.admit(RPM, waiter="b1", standing=batch, **WITHIN), Grant)
    taken = await h.deny(RPM, waiter="i2", standing=interactive, **WITHIN)
    assert taken.booked_in_s == pytest.approx(1.0)  # b2's


async def test_a_taken_slot_is_charged_for_the_takers_tokens(h: Harness) -> None:
    """The booker's quota paid its own estimate; the caller taking the slot is charged its
    own instead (settle corrects from it): on the source's own quota the bucket reopens
    sooner by the difference, the bookings ahead allowing it."""
    tpm = SourceTerms("tpm", 10, quota=QuotaTerms("source:tpm", tpm=6000))  # 100 a second
    for cost in (1000, 10):  # the burst spent, to the last ten tokens
        while isinstance(answer := await h.admit(tpm, est_tokens=cost), Grant):
            await h.settle(answer, tpm)
    await h.deny(tpm, waiter="b1", standing=BATCH, est_tokens=1000, **WITHIN)
    before = await h.deny(tpm, est_tokens=1000)
    taken = await h.deny(tpm, waiter="i1", standing=INTERACTIVE, est_tokens=10, **WITHIN)
    assert taken.booked_in_s is not None
    after = await h.deny(tpm, est_tokens=1000)
    assert before.reopen_in_s is not None
    # (1000 - 10) / 100 s handed back; b1, booked anew at once, charged its 1000 again
    assert after.reopen_in_s == pytest.approx(before.reopen_in_s - 9.9 + 10.0)


async def test_a_slot_taken_on_a_shared_quota_stays_charged_for_its_bookers_tokens(
    h: Harness,
) -> None:
    """On a quota shared with other sources, whose bookings are not at hand, a caller
    taking a slot booked for more tokens than its own hands nothing back: the bucket
    reopens no sooner."""
    tpm = SourceTerms("tpm", 10, quota=QuotaTerms("tpm-key", tpm=6000))  # 100 a second
    for cost in (1000, 10):  # the burst spent, to the last ten tokens
        while isinstance(answer := await h.admit(tpm, est_tokens=cost), Grant):
            await h.settle(answer, tpm)
    booked = await h.deny(tpm, waiter="b1", standing=BATCH, est_tokens=1000, **WITHIN)
    before = await h.deny(tpm, est_tokens=1000)
    taken = await h.deny(tpm, waiter="i1", standing=INTERACTIVE, est_tokens=10, **WITHIN)
    assert taken.booked_in_s == pytest.approx(booked.booked_in_s)
    after = await h.deny(tpm, est_tokens=1000)
    # nothing handed back; b1, booked anew at once, charged its 1000 again
    assert after.reopen_in_s == pytest.approx(before.reopen_in_s + 10.0)


async def test_a_class_owed_a_slot_takes_a_higher_classs_soonest(h: Harness) -> None:
    """Batch's floor is half the slots used, and interactive used the last one: a batch
    caller takes the soonest slot interactive booked, and its booker books anew."""
    interactive, batch = FLOORED
    first = await booked_by(h, interactive, "i1", "i2", "i3")
    assert first.reopen_in_s is not None
    h.clock.advance(first.reopen_in_s)
    assert isinstance(await h.admit(RPM, waiter="i1", standing=interactive, **WITHIN), Grant)
    taken = await h.deny(RPM, waiter="b1", standing=batch, **WITHIN)
    assert taken.booked_in_s == pytest.approx(1.0)  # i2's
    h.clock.advance(1.0)
    again = await h.deny(RPM, waiter="i2", standing=interactive, **WITHIN)
    assert again.booked_in_s == pytest.approx(2.0)  # after i3's: the bucket's next
    assert isinstance(await h.admit(RPM, waiter="b1", standing=batch, **WITHIN), Grant)


async def test_what_a_class_used_alone_is_not_held_against_it(h: Harness) -> None:
    """Batch's floor is a tenth. It used five slots while no other class wanted them,
    then interactive used nine: batch is owed the next (the nine earned 0.9, its own
    five cost it no more than one share) and takes interactive's soonest slot."""
    interactive = Standing(rank=0, floors=(0.0, 0.1))
    batch = Standing(rank=1, floors=(0.0, 0.1))
    await drain(h, RPM)
    for n in range(5):
        await use(h, batch, f"b{n}")
    for n in range(9):
        await use(h, interactive, f"i{n}")
    for caller in ("i9", "i10"):
        await h.deny(RPM, waiter=caller, standing=interactive, **WITHIN)
    taken = await h.deny(RPM, waiter="b9", standing=batch, **WITHIN)
    assert taken.booked_in_s == pytest.approx(1.0)  # i9's


async def test_a_class_not_yet_owed_a_slot_waits_its_turn(h: Harness) -> None:
    """Batch's floor is a tenth and it used the last slot: the next eight used by
    interactive leave it short of its turn (a ninth would bring it there), so interactive
    callers take its booked slot."""
    interactive = Standing(rank=0, floors=(0.0, 0.1))
    batch = Standing(rank=1, floors=(0.0, 0.1))
    await drain(h, RPM)
    await use(h, batch, "b0")
    for n in range(8):
        await use(h, interactive, f"i{n}")
    await h.deny(RPM, waiter="b1", standing=batch, **WITHIN)
    taken = await h.deny(RPM, waiter="i8", standing=interactive, **WITHIN)
    assert taken.booked_in_s == pytest.approx(1.0)  # b1's


async def test_a_snapshot_counts_the_slots_each_class_booked_ahead(h: Harness) -> None:
    interactive, batch = FLOORED
    await booked_by(h, batch, "b1", "b2")
    assert (await h.store.snapshot(RPM)).booked == (0, 2)
    await h.deny(RPM, waiter="i1", standing=interactive, **WITHIN)  # b1's, taken
    await h.deny(RPM, waiter="i2", standing=interactive, **WITHIN)  # batch is not owed
    # (b1 and b2, robbed by a class above their own, which has a floor, book anew when
    # they ask: rebooked at once, they could not take a slot back once batch is owed)
    assert (await h.store.snapshot(RPM)).booked == (2,)  # (trailing classes with none left out)
    await h.deny(RPM, waiter="b3", standing=batch, **WITHIN)
    assert (await h.store.snapshot(RPM)).booked == (2, 1)


async def test_no_slot_booked_for_fewer_tokens_is_taken_on_a_shared_quota(h: Harness) -> None:
    """The bucket has room at a slot for its booker's tokens alone, and the bookings of the
    other sources sharing a quota cannot be moved later: a higher class's larger call
    does not take it (it would go over the provider's quota there), a smaller one does."""
    tokens = SourceTerms("tok", 10, quota=QuotaTerms("tok-key", tpm=6000))  # 100 a second
    while isinstance(answer := await h.admit(tokens, est_tokens=10), Grant):
        await h.settle(answer, tokens, est_tokens=10, used_tokens=10)
    small = await h.deny(tokens, est_tokens=100, waiter="b1", standing=BATCH, **WITHIN)
    assert small.booked_in_s is not None
    large = await h.deny(tokens, est_tokens=500, waiter="i1", standing=INTERACTIVE, **WITHIN)
    assert large.booked_in_s == pytest.approx(small.booked_in_s + 5.0)  # a slot of its own
    smaller = await h.deny(tokens, est_tokens=50, waiter="i2", standing=INTERACTIVE, **WITHIN)
    assert smaller.booked_in_s == pytest.approx(small.booked_in_s)  # b1's


async def test_a_lower_classs_booking_is_taken_before_a_later_call_of_ones_own(
    h: Harness,
) -> None:
    """A call asking again (it has arrived) could take a later call's slot of its own class
    or a lower class's: the lower class's comes first while soon enough, though the other
    is sooner (the classes' order comes before the order within one)."""
    first = await drain(h, RPM)
    assert first.reopen_in_s is not None
    h.arrivals["i1"] = 0  # (it arrived first: its attempt failed, it asks again)
    h.clock.advance(0.01)
    mine = await h.deny(RPM, waiter="i2", standing=INTERACTIVE, **WITHIN)
    lower = await h.deny(RPM, waiter="b1", standing=BATCH, **WITHIN)
    assert lower.booked_in_s == pytest.approx(mine.booked_in_s + 1.0)
    again = await h.deny(RPM, waiter="i1", standing=INTERACTIVE, **WITHIN)
    assert again.booked_in_s == pytest.approx(lower.booked_in_s)


async def test_a_booker_booked_anew_never_moves_a_call_served_before_it(h: Harness) -> None:
    """A larger call taking a smaller booking's slot moves the bookings after it later;
    a booker booked anew after its slot was taken takes no such slot, so the call that
    took its slot (served before it) keeps the slot it was told and is admitted there."""
    tpm = SourceTerms("tpm", 100, quota=QuotaTerms("source:tpm", tpm=6000))  # 100 a second
    held = None
    for est in (1500, 10, 1):  # the burst spent, to the last token
        while isinstance(answer := await h.admit(tpm, est_tokens=est), Grant):
            if held is None and est == 1500:
                held = answer  # settled later, 100 of its tokens unused: 1 s handed back
            else:
                await h.settle(answer, tpm, est_tokens=est, used_tokens=est)
    assert held is not None
    high, middle, low = Standing(rank=0), Standing(rank=1), Standing(rank=2)
    await h.deny(tpm, waiter="low", standing=low, est_tokens=10, **WITHIN)
    await h.settle(held, tpm, est_tokens=1500, used_tokens=1400)
    booked = await h.deny(tpm, waiter="middle", standing=middle, est_tokens=1500, **WITHIN)
    taken = await h.deny(tpm, waiter="high", standing=high, est_tokens=1500, **WITHIN)
    assert booked.booked_in_s is not None
    assert taken.booked_in_s == pytest.approx(booked.booked_in_s)  # middle's slot, kept
    h.clock.advance(taken.booked_in_s)
    assert isinstance(await h.admit(tpm, waiter="high", standing=high, est_tokens=1500), Grant)
