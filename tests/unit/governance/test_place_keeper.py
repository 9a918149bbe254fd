"""The place keeper: one batched renewal every third of a claim keeps every waiting call's
places; a place the store no longer keeps, or a renewal that fails or comes too late,
ends that call's wait (it asks again)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from polygate_celery.core.terms import SourceTerms
from polygate_celery.governance.places import PlaceKeeper
from polygate_celery.testing import VirtualClock

A, B, C = SourceTerms("a", 1), SourceTerms("b", 1), SourceTerms("c", 1)
Asked = list[tuple[SourceTerms, str, float]]


class KeepingStore:
    """A store's `keep_places` alone: it answers from `kept` (by call id and source; kept
    unless listed), or fails, hangs, or answers too few, as told."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.mode = "ok"
        self.dropped: set[tuple[str, str]] = set()
        self.delay_s = 0.0
        self.batches: list[tuple[float, Asked]] = []

    async def keep_places(self, places: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        self.batches.append((self.clock.now(), list(places)))
        await self.clock.sleep(self.delay_s)
        if self.mode == "raise":
            raise ConnectionError("the store is gone")
        if self.mode == "hang":
            await asyncio.Event().wait()
        kept = [(call_id, terms.name) not in self.dropped for terms, call_id, _ in places]
        return kept[:-1] if self.mode == "short" else kept

    def calls(self) -> list[list[str]]:
        """Each batch's call ids, one per place asked for (a call waiting at two sources
        is there twice)."""
        return [[call for _, call, _ in asked] for _, asked in self.batches]


@pytest.fixture
def store(clock: VirtualClock) -> KeepingStore:
    return KeepingStore(clock)


@pytest.fixture
def keeper(store: KeepingStore, clock: VirtualClock) -> PlaceKeeper:
    return PlaceKeeper(store, clock)  # type: ignore[arg-type]


async def test_waiting_calls_are_kept_by_one_batch_every_third_of_the_shortest_claim(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    one = keeper.hold([A, B], "one", claim_s=3.0)
    two = keeper.hold([C], "two", claim_s=6.0)
    await clock.sleep(10.5)  # (off the renewals' instants: a tie wakes this test first)
    assert [at for at, _ in store.batches] == [1.0 * n for n in range(1, 11)]
    assert store.batches[0][1] == [(A, "one", 3.0), (B, "one", 3.0), (C, "two", 6.0)]
    assert not one.lost.is_set()
    assert not two.lost.is_set()
    assert one.valid_until == 10.0 + 3.0  # each renewal sent at t keeps it until t + claim
    assert two.valid_until == 10.0 + 6.0
    await keeper.aclose()


@pytest.mark.parametrize(
    ("dropped", "lost"),
    [
        (("first", "a"), [True, False, False]),
        (("both", "a"), [False, True, False]),
        (("both", "b"), [False, True, False]),
        (("last", "c"), [False, False, True]),
    ],
)
async def test_a_place_the_store_no_longer_keeps_at_one_source_ends_that_wait_alone(
    keeper: PlaceKeeper,
    store: KeepingStore,
    clock: VirtualClock,
    dropped: tuple[str, str],
    lost: list[bool],
) -> None:
    first = keeper.hold([A], "first", claim_s=3.0)
    both = keeper.hold([A, B], "both", claim_s=3.0)
    last = keeper.hold([C], "last", claim_s=3.0)
    store.dropped = {dropped}  # its permit was handed over there, or its claim lapsed
    await clock.sleep(1.1)
    places = (first, both, last)
    assert [p.lost.is_set() for p in places] == lost
    await clock.sleep(1.0)  # the next batch asks for the others only
    kept = [p for p, gone in zip(places, lost, strict=True) if not gone]
    assert store.calls()[-1] == [call for p in kept for call in [p.call_id] * len(p.sources)]
    assert {p.valid_until for p in kept} == {2.0 + 3.0}
    await keeper.aclose()


@pytest.mark.parametrize("mode", ["raise", "short"])
async def test_a_renewal_that_fails_ends_every_wait_it_carried(
    keeper: PlaceKeeper,
    store: KeepingStore,
    clock: VirtualClock,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    places = [keeper.hold([A], "one", 3.0), keeper.hold([A, B], "two", 3.0)]
    store.mode = mode
    with caplog.at_level(logging.DEBUG, logger="polygate_celery"):
        await clock.sleep(1.1)
    assert all(p.lost.is_set() for p in places)
    assert store.batches[0][0] == 1.0
    if mode == "raise":  # why, for whoever debugs the store
        (record,) = caplog.records
        assert record.getMessage() == "keeping 2 waiting call(s) in queue failed"
        assert record.exc_info is not None
        assert isinstance(record.exc_info[1], ConnectionError)
    await keeper.aclose()


@pytest.mark.parametrize("claim_s", [3.0, 0.9])
async def test_a_renewal_still_unanswered_when_the_soonest_claim_ends_loses_them_then(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock, claim_s: float
) -> None:
    soon = keeper.hold([A], "soon", claim_s=claim_s)
    await clock.sleep(claim_s / 6)
    later = keeper.hold([B], "later", claim_s=30.0)
    store.mode = "hang"
    await soon.lost.wait()
    # Sent a third of a claim in, while the first claim lasts a whole one: given up then.
    assert clock.now() == pytest.approx(claim_s)
    assert later.lost.is_set()
    await keeper.aclose()


async def test_a_call_with_a_shorter_claim_is_kept_from_its_own_third_on(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    """The keeper sleeping towards the first call's renewal (at 1.0) wakes for a call of
    another scope whose claim would end first (at 1.1): both are renewed at 0.7."""
    long = keeper.hold([A], "long", claim_s=3.0)
    await clock.sleep(0.5)
    short = keeper.hold([B], "short", claim_s=0.6)  # (a scope that polls more often)
    await clock.sleep(0.25)
    assert [at for at, _ in store.batches] == [pytest.approx(0.7)]
    assert not short.lost.is_set()
    assert not long.lost.is_set()
    await clock.sleep(3.0)
    assert not short.lost.is_set()  # renewed every 0.2 s since
    assert short.valid_until == pytest.approx(store.batches[-1][0] + 0.6)
    await keeper.aclose()


async def test_a_keeper_that_wakes_late_drops_the_places_whose_claims_ran_out(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    """Its process was busy past a claim's end (the event loop blocked): that place is
    dropped, not renewed, since the store may have passed it over; the others are kept."""
    ended = keeper.hold([A], "ended", claim_s=3.0)  # until 3.0, due at 1.0
    await clock.sleep(0)
    clock.advance(2.0)
    kept = keeper.hold([B], "kept", claim_s=3.0)  # held at 2.0, until 5.0
    clock.advance(1.0)  # the keeper wakes at 3.0, exactly when the first claim ends
    await clock.sleep(0.01)
    assert ended.lost.is_set()
    assert not kept.lost.is_set()
    assert list(zip([at for at, _ in store.batches], store.calls(), strict=True)) == [
        (3.0, ["kept"])
    ]
    await keeper.aclose()


async def test_a_renewal_answered_in_time_however_slowly_keeps_the_places(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    place = keeper.hold([A], "slow", claim_s=3.0)
    store.delay_s = 1.5  # answered at 2.5, before the claim's end at 3.0
    await clock.sleep(2.6)
    assert not place.lost.is_set()
    assert place.valid_until == 1.0 + 3.0  # from when it was sent, not answered
    await keeper.aclose()


async def test_a_wait_that_ends_during_a_renewal_is_left_as_it_is(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    place = keeper.hold([A], "done", claim_s=3.0)
    other = keeper.hold([B], "other", claim_s=3.0)
    store.delay_s = 0.5
    store.dropped = {("done", "a")}
    await clock.sleep(1.2)  # sent at 1.0, answered at 1.5
    place.__exit__(None, None, None)  # the call got its permit meanwhile and left
    await clock.sleep(0.5)
    assert not place.lost.is_set()  # not lost: it is gone, and its wait is over
    assert not other.lost.is_set()
    assert other.valid_until == 1.0 + 3.0
    await keeper.aclose()


async def test_leaving_ends_the_renewals_of_that_call_only(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    with keeper.hold([A], "brief", claim_s=3.0):
        await clock.sleep(0.5)
    stays = keeper.hold([B], "stays", claim_s=3.0)
    await clock.sleep(1.1)
    assert store.calls() == [["stays"]]
    assert not stays.lost.is_set()
    await keeper.aclose()


async def test_a_stale_place_leaving_does_not_take_a_newer_one_of_the_same_call(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    old = keeper.hold([A], "same", claim_s=3.0)
    new = keeper.hold([A], "same", claim_s=3.0)  # the call waits again, under the same id
    keeper.leave(old)
    await clock.sleep(1.1)
    assert store.calls()[0] == ["same"]
    assert new.valid_until == 1.0 + 3.0
    await keeper.aclose()


async def test_a_keeper_idle_between_waits_keeps_the_next_one(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    with keeper.hold([A], "first", claim_s=3.0):
        await clock.sleep(1.5)
    await clock.sleep(5.0)  # nobody waits: no renewals
    assert len(store.batches) == 1
    second = keeper.hold([B], "second", claim_s=3.0)
    await clock.sleep(2.2)
    assert len(store.batches) == 3
    assert not second.lost.is_set()
    await keeper.aclose()


async def test_closing_the_keeper_stops_its_renewals_quietly(
    keeper: PlaceKeeper, store: KeepingStore, clock: VirtualClock
) -> None:
    keeper.hold([A], "one", claim_s=3.0)
    await clock.sleep(1.5)
    await keeper.aclose()  # returns, raising nothing
    await clock.sleep(5.0)
    assert len(store.batches) == 1


def test_a_keeper_moves_to_the_event_loop_of_its_latest_wait(clock: VirtualClock) -> None:
    """A worker may run each task on a fresh event loop: the keeper's renewals follow."""
    store = KeepingStore(clock)
    keeper = PlaceKeeper(store, clock)  # type: ignore[arg-type]

    async def wait_once(call_id: str) -> bool:
        with keeper.hold([A], call_id, claim_s=3.0) as place:
            await clock.sleep(1.5)
            return place.lost.is_set()

    assert asyncio.run(wait_once("first")) is False
    assert asyncio.run(wait_once("second")) is False
    assert store.calls() == [
        ["first"],
        ["second"],
    ]


def test_a_keeper_left_running_on_another_loop_starts_again_on_this_one(
    clock: VirtualClock,
) -> None:
    """Its task on the first loop is not done (that loop was only stopped), yet the wait
    on the second loop is kept from the second loop."""
    store = KeepingStore(clock)
    keeper = PlaceKeeper(store, clock)  # type: ignore[arg-type]
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:

        async def wait_once(call_id: str) -> None:
            with keeper.hold([A], call_id, claim_s=3.0):
                await clock.sleep(1.5)

        first.run_until_complete(wait_once("first"))
        second.run_until_complete(wait_once("second"))
        assert store.calls() == [
            ["first"],
            ["second"],
        ]
    finally:
        for loop in (first, second):
            for task in asyncio.all_tasks(loop):
                task.cancel()
                loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
            loop.close()
