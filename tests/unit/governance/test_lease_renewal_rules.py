"""The lease rule on the renewer itself: what extends a lease, what stops its attempt, when.

A lease is guaranteed for five sixths of `lease_s` from the sending of its last
successful renewal; past that the attempt is stopped with GovernanceBackendError,
unless the lease is gone already (the store says so, or the renewer first runs past
the lease's end): then the attempt runs on, its lease marked lapsed.
These drive `LeaseRenewer` directly in virtual time, with a store whose renewals
do what each test says (the Redis store's real renewals are tested elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from polygate_celery import GovernanceBackendError, MemoryStore
from polygate_celery.core.terms import SourceTerms
from polygate_celery.governance.lease import LeaseRenewer
from polygate_celery.store import Grant
from polygate_celery.testing import VirtualClock

LEASE_S = 30.0
SOURCE = SourceTerms("a", max_concurrency=4)


class RenewalStore(MemoryStore):
    """Renewals answer as `modes` say, one mode per renewal (the last one repeats)."""

    def __init__(self, clock: VirtualClock, *modes: str, delay_s: float = 0.0) -> None:
        super().__init__(clock)
        self.clock = clock
        self.modes = list(modes) or ["ok"]
        self.delay_s = delay_s
        self.renewals: list[tuple[float, list[str]]] = []

    async def renew(self, leases: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        self.renewals.append((self.clock.now(), [permit for _, permit, _ in leases]))
        mode = self.modes.pop(0) if len(self.modes) > 1 else self.modes[0]
        await self.clock.sleep(self.delay_s)
        if mode == "raise":
            raise GovernanceBackendError("connection refused")
        if mode == "hang":
            await asyncio.Event().wait()
        if mode == "short":  # a broken answer: fewer entries than leases asked about
            return [True for _ in leases][1:]
        if mode == "none":  # a broken answer: no list at all
            return None  # type: ignore[return-value]
        return [mode == "ok" for _ in leases]


async def attempt(
    renewer: LeaseRenewer,
    clock: VirtualClock,
    permit: str,
    seconds: float,
    lease_s: float = LEASE_S,
) -> tuple[float, str]:
    """Hold `permit` for an attempt of `seconds`: (when it ended, "done" or the error)."""
    try:
        with renewer.hold(SOURCE, Grant("a", permit, clock.now(), lease_s), clock.now()):
            await clock.sleep(seconds)
    except GovernanceBackendError as error:
        return clock.now(), str(error)
    return clock.now(), "done"


async def test_a_renewed_lease_is_guaranteed_five_sixths_of_a_lease_from_the_renewal() -> None:
    clock = VirtualClock()
    store = RenewalStore(clock, "ok", "raise")  # renewed at t=10, never again
    renewer = LeaseRenewer(store, clock)

    ended, why = await attempt(renewer, clock, "p", 300)

    assert ended == 10 + LEASE_S * 5 / 6
    assert "could not be renewed in time" in why
    await renewer.aclose()


async def test_a_slow_renewal_that_succeeds_extends_the_lease() -> None:
    clock = VirtualClock()
    store = RenewalStore(clock, "ok", delay_s=2.0)
    renewer = LeaseRenewer(store, clock)

    assert await attempt(renewer, clock, "p", 100) == (100.0, "done")
    await renewer.aclose()


async def test_a_hanging_renewal_never_lets_an_attempt_outrun_its_guarantee() -> None:
    # A short lease: the first renewal (at lease/3) has less than a second of guarantee left.
    clock = VirtualClock()
    renewer = LeaseRenewer(RenewalStore(clock, "hang"), clock)

    ended, why = await attempt(renewer, clock, "p", 100, lease_s=1.2)

    assert ended == pytest.approx(1.2 * 5 / 6)
    assert "could not be renewed in time" in why
    await renewer.aclose()


@pytest.mark.parametrize("answer", ["short", "none"])
async def test_a_broken_renewal_answer_fails_closed(answer: str) -> None:
    clock = VirtualClock()
    renewer = LeaseRenewer(RenewalStore(clock, answer), clock)

    results = await asyncio.gather(
        attempt(renewer, clock, "p1", 300), attempt(renewer, clock, "p2", 300)
    )

    assert [ended for ended, _ in results] == [LEASE_S * 5 / 6] * 2
    assert all("could not be renewed in time" in why for _, why in results)
    await renewer.aclose()


async def test_a_reclaimed_lease_is_marked_lapsed_and_its_attempt_runs_on() -> None:
    """The store no longer holds the permit: stopping the attempt would not give it back,
    only throw away a request that is paid for (SPEC §3 rule 14)."""
    clock = VirtualClock()
    store = RenewalStore(clock, "reclaimed")
    renewer = LeaseRenewer(store, clock)

    with renewer.hold(SOURCE, Grant("a", "p", 0.0, LEASE_S), 0.0) as lease:
        await clock.sleep(300)

    assert (clock.now(), lease.lost, lease.lapsed) == (300.0, None, "the store no longer held it")
    assert store.renewals == [(10.0, ["p"])]  # never renewed again
    await renewer.aclose()


class PartlyReclaimedStore(RenewalStore):
    """Renewals hold every lease but those of `reclaimed` permits."""

    def __init__(self, clock: VirtualClock, *reclaimed: str) -> None:
        super().__init__(clock)
        self.reclaimed = set(reclaimed)

    async def renew(self, leases: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        await super().renew(leases)
        return [permit not in self.reclaimed for _, permit, _ in leases]


async def test_a_reclaimed_lease_leaves_the_others_renewed() -> None:
    clock = VirtualClock()
    store = PartlyReclaimedStore(clock, "p1")
    renewer = LeaseRenewer(store, clock)

    with (
        renewer.hold(SOURCE, Grant("a", "p1", 0.0, LEASE_S), 0.0) as first,
        renewer.hold(SOURCE, Grant("a", "p2", 0.0, LEASE_S), 0.0) as second,
    ):
        await clock.sleep(35)

    assert (first.lapsed, second.lapsed, second.lost) == ("the store no longer held it", None, None)
    assert store.renewals == [(10.0, ["p1", "p2"]), (20.0, ["p2"]), (30.0, ["p2"])]
    await renewer.aclose()


@pytest.mark.parametrize(
    ("frozen_at", "frozen_s", "lapsed"),
    [
        (5, 26, True),  # resumes at 31, past the granted lease's end (30)
        (5, 25, True),  # resumes at 30, the granted lease's end: gone already
        (5, 21, False),  # resumes at 26: past its guarantee (25), not its end
        (15, 26, True),  # renewed at 10: resumes at 41, past the renewed lease's end (40)
        (15, 21, False),  # resumes at 36: past 10 + 25, before 40
    ],
)
async def test_a_renewer_held_up_past_a_leases_end_lets_its_attempt_run_on(
    frozen_at: float, frozen_s: float, lapsed: bool
) -> None:
    """A process stopped (SIGSTOP, a VM or GC pause) with an attempt in flight: when it
    resumes before its lease can have lapsed the fence still holds and stops the attempt;
    after, the permit may be another's already, and the attempt runs on to its answer."""
    clock = VirtualClock()
    renewer = LeaseRenewer(RenewalStore(clock, "ok"), clock)

    try:
        with renewer.hold(SOURCE, Grant("a", "p", 0.0, LEASE_S), 0.0) as lease:
            await clock.sleep(frozen_at)
            clock.advance(frozen_s)  # no task runs meanwhile
            await clock.sleep(1)  # the renewer's overdue turn comes first
        outcome = "done"
    except GovernanceBackendError as error:
        outcome = str(error)

    resumed = frozen_at + frozen_s
    if lapsed:
        assert (outcome, clock.now()) == ("done", resumed + 1)
        assert lease.lapsed == "it lapsed while this process was held up"
    else:
        assert "could not be renewed in time" in outcome
        assert clock.now() == resumed
    await renewer.aclose()


async def test_a_lapsed_lease_stops_its_attempt_with_that_reason() -> None:
    clock = VirtualClock()
    renewer = LeaseRenewer(RenewalStore(clock, "raise"), clock)

    assert await attempt(renewer, clock, "p", 300) == (
        LEASE_S * 5 / 6,
        "governance store unavailable: attempt at 'a' stopped: "
        "its permit lease could not be renewed in time",
    )
    await renewer.aclose()


async def test_an_attempt_ending_during_a_renewal_leaves_the_others_renewed() -> None:
    # p1 ends at 10.5 while the t=10 renewal (1 s) is in flight; that renewal still
    # extends p2, so when renewals fail from then on p2 is stopped at 10 + 25, not 25.
    clock = VirtualClock()
    store = RenewalStore(clock, "ok", "raise", delay_s=1.0)
    renewer = LeaseRenewer(store, clock)

    first, second = await asyncio.gather(
        attempt(renewer, clock, "p1", 10.5), attempt(renewer, clock, "p2", 300)
    )

    assert first == (10.5, "done")
    assert second[0] == 10 + LEASE_S * 5 / 6
    await renewer.aclose()


async def test_a_lost_lease_is_not_renewed_again() -> None:
    clock = VirtualClock()
    store = RenewalStore(clock, "raise")
    renewer = LeaseRenewer(store, clock)

    ended, _ = await attempt(renewer, clock, "p", 300)
    await clock.sleep(LEASE_S)  # let the renewer run on after the loss

    assert ended == LEASE_S * 5 / 6
    assert store.renewals
    assert all(at < ended for at, _ in store.renewals)
    await renewer.aclose()


async def test_an_idle_renewer_renews_the_next_attempt() -> None:
    clock = VirtualClock()
    store = RenewalStore(clock)
    renewer = LeaseRenewer(store, clock)

    assert await attempt(renewer, clock, "p1", 1) == (1.0, "done")
    await clock.sleep(100)  # nothing held: the renewer idles
    assert await attempt(renewer, clock, "p2", 100) == (201.0, "done")
    assert [permits for _, permits in store.renewals] == [["p2"]] * 9
    await renewer.aclose()


async def test_a_closed_renewer_sends_nothing_more_and_restarts_for_a_new_attempt() -> None:
    clock = VirtualClock()
    store = RenewalStore(clock)
    renewer = LeaseRenewer(store, clock)
    held = asyncio.ensure_future(attempt(renewer, clock, "p1", 300))
    await clock.sleep(15)  # one renewal, at t=10

    await renewer.aclose()
    sent = len(store.renewals)
    await clock.sleep(5)
    assert sent == len(store.renewals) == 1
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held

    assert await attempt(renewer, clock, "p2", 100) == (120.0, "done")
    assert [permits for _, permits in store.renewals[1:]] == [["p2"]] * 9
    await renewer.aclose()


async def test_closing_a_renewer_that_never_held_a_lease_does_nothing() -> None:
    clock = VirtualClock()
    await LeaseRenewer(RenewalStore(clock), clock).aclose()


async def test_a_failed_renewal_is_logged_with_the_number_of_leases(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    renewer = LeaseRenewer(RenewalStore(clock, "raise"), clock)
    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        await asyncio.gather(attempt(renewer, clock, "p1", 300), attempt(renewer, clock, "p2", 300))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings
    assert all("renewing 2 permit lease(s) failed" in message for message in warnings)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    assert all("'a'" in m and "could not be renewed in time" in m for m in errors)
    await renewer.aclose()


async def test_a_quick_call_sets_the_idle_renewers_next_round_a_third_of_its_lease_on() -> None:
    """A lease held and let go at once wakes an idle renewer, which then sleeps a third
    of that lease (the quick calls that come and go meanwhile do not wake it again): an
    attempt begun during that sleep is first renewed when it ends."""
    clock = VirtualClock()
    store = RenewalStore(clock)
    renewer = LeaseRenewer(store, clock)
    assert await attempt(renewer, clock, "first", 1) == (1.0, "done")
    await clock.sleep(100)  # t=101: nothing held, the renewer idles

    with renewer.hold(SOURCE, Grant("a", "quick", clock.now(), 15.0), clock.now()):
        pass  # its attempt ends before the renewer runs
    await clock.sleep(1)

    assert await attempt(renewer, clock, "long", 20) == (122.0, "done")
    assert store.renewals == [(106.0, ["long"]), (116.0, ["long"])]  # 101 + 15 / 3, then every 10
    await renewer.aclose()
