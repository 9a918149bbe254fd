"""Leased permits: renewed in batches while attempts run; an unsure lease stops its attempt."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import pytest

from polygate_celery import GovernanceBackendError, MemoryStore
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
            return [False for _ in leases]
        return await super().renew(leases)


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
        ("reclaimed", 10.0, "reclaimed"),  # told at the first renewal
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
