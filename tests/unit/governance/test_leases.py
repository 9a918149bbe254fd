"""Leased permits: renewed in batches while attempts run; an unsure lease stops its attempt,
a lapsed one keeps its answer."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from polygate_celery import GovernanceBackendError, MemoryStore, Outcome
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store import AdmitRequest, Denial, Grant
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, make_config

LEASE_S = 30.0


class LeasingStore(MemoryStore):
    """The in-memory store, handing out leases, with renewals that can be made to fail."""

    def __init__(self, clock: VirtualClock, renew: str = "ok", admit_delay_s: float = 0) -> None:
        super().__init__(clock)
        self.clock = clock
        self.renew_mode = renew
        self.admit_delay_s = admit_delay_s
        self.batches: list[int] = []
        self.gate = asyncio.Event()

    async def admit(self, request: AdmitRequest) -> Grant | Denial:
        admission = await super().admit(request)
        await self.clock.sleep(self.admit_delay_s)
        if isinstance(admission, Grant):
            return Grant(admission.source, admission.permit_id, admission.admitted_at, LEASE_S)
        return admission

    async def renew(self, leases: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        self.batches.append(len(leases))
        if self.renew_mode == "raise":
            raise GovernanceBackendError("connection refused")
        if self.renew_mode == "crash":
            raise RuntimeError("a bug in a store")
        if self.renew_mode == "slow-reclaimed":
            await self.gate.wait()
            return [False for _ in leases]
        if self.renew_mode == "hang":
            await asyncio.Event().wait()
        if self.renew_mode == "reclaimed":
            for source, permit, _ in leases:
                self.lapse(source, permit)
            return [False for _ in leases]
        return await super().renew(leases)

    def lapse(self, source: SourceTerms, permit_id: str) -> None:
        """The lease ran out: the store forgets the permit (as Redis's reclaim does)."""
        self._source(source).permits.discard(permit_id)

    def lapse_all(self, name: str) -> None:
        self._sources[name].permits.clear()


class FreezingSource:
    """A source whose "frozen" request is at the provider when its process is stopped
    for `frozen_s` (no task runs meanwhile: time jumps) past its lease; the provider
    answers it, and its answer is read after the process resumes. Other requests take
    10 s. Counts the requests in flight at once."""

    def __init__(self, clock: VirtualClock, store: LeasingStore, frozen_s: float) -> None:
        self.clock = clock
        self.store = store
        self.frozen_s = frozen_s
        self.in_flight = 0
        self.peak = 0

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if payload != "frozen":
                await self.clock.sleep(10)
                return Outcome.success("other")
            await self.clock.sleep(5)
            self.store.lapse_all("a")  # while it is stopped, its lease runs out in the store
            self.clock.advance(self.frozen_s)  # SIGSTOP ... SIGCONT
            await self.clock.sleep(1)  # reading the answer, after the renewer's overdue turn
            return Outcome.success("paid")
        finally:
            self.in_flight -= 1


async def test_a_long_attempt_keeps_its_lease_by_batched_renewals(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    store = LeasingStore(clock)
    source = ScriptedSource(clock, itertools.repeat(steps.ok("done", duration_s=300)))
    gw = own_store_gateway(
        make_config("chat", {"a": {"timeout_s": 600}}), {"a": source}, store=store
    )

    results = await asyncio.gather(*(gw.call("s", i) for i in range(3)))

    assert [r.value for r in results] == ["done"] * 3
    # Every 10 s until the attempts end at 300 s, one batch whatever the number of attempts.
    assert len(store.batches) in {29, 30}
    assert set(store.batches) == {3}
    await gw.aclose()


@pytest.mark.parametrize(
    ("mode", "stopped_by", "why"),
    [
        ("raise", 25.0, "could not be renewed in time"),  # lease * 5/6, before it lapses
        ("hang", 25.0, "could not be renewed in time"),
        ("crash", 25.0, "could not be renewed in time"),  # the renewer survives, fenced
    ],
)
async def test_an_attempt_whose_lease_is_not_guaranteed_is_stopped_before_it_lapses(
    clock: VirtualClock, own_store_gateway: GatewayFactory, mode: str, stopped_by: float, why: str
) -> None:
    store = LeasingStore(clock, renew=mode)
    source = ScriptedSource.always(clock, steps.ok(duration_s=300))
    gw = own_store_gateway(
        make_config("chat", {"a": {"timeout_s": 600}}), {"a": source}, store=store
    )

    with pytest.raises(GovernanceBackendError, match=why):
        await gw.call("s", "x")

    assert clock.now() == stopped_by
    assert source.journal[0].outcome is None  # the request itself was cut, not answered
    assert (await gw.snapshot("s"))[0].permits_in_use == 0
    await gw.aclose()


async def test_a_cancelled_leased_attempt_is_cancelled_not_a_backend_error(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    store = LeasingStore(clock)
    gw = own_store_gateway(
        make_config("chat", {"a": {"timeout_s": 600}}),
        {"a": ScriptedSource.always(clock, steps.ok(duration_s=300))},
        store=store,
    )
    call = asyncio.ensure_future(gw.call("s", "x"))
    await clock.sleep(15)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert (await gw.snapshot("s"))[0].permits_in_use == 0
    await gw.aclose()


async def test_a_renewal_answered_after_its_attempt_ended_cancels_nothing(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    """The renewal is in flight when the attempt settles; its 'not held' is old news."""
    store = LeasingStore(clock, renew="slow-reclaimed")
    source = ScriptedSource(
        clock, [steps.ok("first", duration_s=10.5), steps.ok("second", duration_s=1)]
    )
    gw = own_store_gateway(
        make_config("chat", {"a": {"timeout_s": 600}}), {"a": source}, store=store
    )

    assert (await gw.call("s", "x")).value == "first"  # ends at 10.5, the t=10 renewal pending
    store.gate.set()
    assert (await gw.call("s", "y")).value == "second"  # not cancelled by that renewal
    await gw.aclose()


async def test_a_grant_that_arrives_too_late_sends_nothing(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    store = LeasingStore(clock, admit_delay_s=LEASE_S * 5 / 6)
    source = ScriptedSource.always(clock, steps.ok())
    gw = own_store_gateway(make_config("chat"), {"a": source}, store=store)

    with pytest.raises(GovernanceBackendError, match="too late"):
        await gw.call("s", "x")
    assert source.attempts == 0
    assert (await gw.snapshot("s"))[0].permits_in_use == 0


def lapse_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "lapsed" in r.getMessage()]


async def test_a_paid_answer_whose_lease_lapsed_while_its_process_was_frozen_is_returned(
    clock: VirtualClock, own_store_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC §3 rule 14: cap 1, the holder stopped 60 s (twice its lease) with its request
    at the provider; meanwhile its permit went to another call. On resume its renewer runs
    first and finds the lease gone: the paid answer is returned, not a backend error."""
    store = LeasingStore(clock)
    source = FreezingSource(clock, store, frozen_s=2 * LEASE_S)
    gw = own_store_gateway(
        make_config("chat", {"a": {"timeout_s": 600, "max_concurrency": 1}}),
        {"a": source},
        store=store,
    )
    frozen = asyncio.ensure_future(gw.call("s", "frozen"))
    await clock.sleep(5.5)  # wakes when the process resumes, before the renewer
    other = asyncio.ensure_future(gw.call("s", "other"))  # admitted: the lease lapsed

    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        result = await frozen

    assert (result.value, clock.now()) == ("paid", 5 + 2 * LEASE_S + 1)
    assert [a.outcome for a in result.attempts] == ["success"]
    [warning] = lapse_warnings(caplog)
    assert all(name in warning for name in ("'s'", "'a'"))
    assert source.peak == 2  # the cap, exceeded while the frozen request was answered
    # Settled as far as the store allows: the scope progressed, the breaker is closed,
    # and the permit now held by the other call is still its own.
    assert await store.progress_age_s("s") == 0
    snapshot = (await gw.snapshot("s"))[0]
    assert (snapshot.permits_in_use, snapshot.breaker) == (1, "closed")
    assert (await other).value == "other"
    assert (await gw.snapshot("s"))[0].permits_in_use == 0
    await gw.aclose()


async def test_a_lease_the_store_no_longer_holds_lets_its_attempt_finish_with_its_answer(
    clock: VirtualClock, own_store_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Told at the first renewal (t=10) that the permit is gone: stopping the request
    would not give the permit back, only throw away what is paid for."""
    store = LeasingStore(clock, renew="reclaimed")
    source = ScriptedSource.always(clock, steps.ok("answer", duration_s=300))
    gw = own_store_gateway(
        make_config("chat", {"a": {"timeout_s": 600}}), {"a": source}, store=store
    )

    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        result = await gw.call("s", "x")

    assert (result.value, clock.now()) == ("answer", 300.0)
    assert store.batches == [1]  # a lapsed lease is not renewed again
    [warning] = lapse_warnings(caplog)
    assert all(text in warning for text in ("'s'", "'a'", "no longer held"))
    assert (await gw.snapshot("s"))[0].permits_in_use == 0
    assert await store.progress_age_s("s") == 0
    await gw.aclose()


async def test_a_failure_whose_lease_lapsed_is_judged_as_any_failure(
    clock: VirtualClock, own_store_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = LeasingStore(clock, renew="reclaimed")
    source = ScriptedSource(
        clock, [steps.server_error(duration_s=30), steps.ok("second", duration_s=1)]
    )
    gw = own_store_gateway(
        make_config("chat", {"a": {"timeout_s": 600}}), {"a": source}, store=store
    )

    with caplog.at_level(logging.WARNING, logger="polygate_celery"):
        result = await gw.call("s", "x")

    assert result.value == "second"
    assert [a.outcome for a in result.attempts] == ["transient", "success"]
    assert len(lapse_warnings(caplog)) == 1  # the first attempt's
    assert (await gw.snapshot("s"))[0].breaker_failures == 0
    await gw.aclose()
