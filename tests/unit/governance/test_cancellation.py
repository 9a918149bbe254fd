"""Cancellation passes straight through every attempt and every wait, and releases permits."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from polygate_celery import GovernanceBackendError, MemoryStore, Outcome, Store
from polygate_celery.core.breaker import Effect
from polygate_celery.store import Settlement
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, make_config
from tests.unit.governance.recording import RecordingStore


async def cancel_at(clock: VirtualClock, task: asyncio.Task[object], when: float) -> None:
    await clock.sleep(when - clock.now())
    task.cancel()


async def run_and_cancel(
    clock: VirtualClock,
    gateway: GatewayFactory,
    source: ScriptedSource,
    when: float,
    **scope: object,
) -> int:
    """Cancel a call at `when`; return the permits still held afterwards."""
    gw = gateway(make_config("chat", **scope), {"a": source})
    call = asyncio.ensure_future(gw.call("s", "x"))
    canceller = asyncio.ensure_future(cancel_at(clock, call, when))  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await call
    await canceller
    return (await gw.snapshot("s"))[0].permits_in_use


async def test_cancel_inside_an_attempt(clock: VirtualClock, gateway: GatewayFactory) -> None:
    source = ScriptedSource.always(clock, steps.ok(duration_s=100))
    held = await run_and_cancel(clock, gateway, source, when=50)
    assert held == 0
    assert clock.now() == 50.0
    assert source.journal[0].outcome is None  # the attempt never finished


async def test_cancel_inside_a_backoff(clock: VirtualClock, gateway: GatewayFactory) -> None:
    source = ScriptedSource.always(clock, steps.server_error())
    held = await run_and_cancel(clock, gateway, source, when=0.5, backoff_base_s=2)
    assert (held, source.attempts) == (0, 1)


async def test_cancel_while_waiting_for_a_runnable_source(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    await store.pause_source("a", 1_000)
    source = ScriptedSource.always(clock, steps.ok())
    held = await run_and_cancel(clock, gateway, source, when=120)
    assert (held, source.attempts, clock.now()) == (0, 0, 120.0)


async def test_cancelled_half_open_probe_frees_the_probe_slot(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource(
        clock,
        itertools.chain(
            [steps.server_error()] * 5,  # opens the breaker (threshold 5)
            [steps.ok(duration_s=100)],  # the half-open probe, cancelled
            itertools.repeat(steps.ok("after")),
        ),
    )
    config = make_config("chat", {"a": {"breaker": {"cooldown_s": 30}}}, max_attempts=5)
    gw = gateway(config, {"a": source})
    with pytest.raises(Exception, match="fail_fast"):  # five outage failures: breaker open
        await gw.call("s", "x", fail_fast=True)

    probe = asyncio.ensure_future(gw.call("s", "probe"))
    canceller = asyncio.ensure_future(cancel_at(clock, probe, clock.now() + 60))  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await probe
    await canceller

    assert (await gw.call("s", "next")).value == "after"


class SlowSettleStore(MemoryStore):
    async def settle(self, settlement: Settlement) -> bool:
        await self.clock.sleep(5)
        return await super().settle(settlement)


class BrokenAdapter:
    async def send(self, payload: object, *, timeout_s: float) -> Outcome:
        raise ValueError("an adapter bug")


async def test_a_cancellation_during_the_release_still_passes_through(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    store = SlowSettleStore(clock)
    store.clock = clock
    gw = own_store_gateway(make_config("chat"), {"a": BrokenAdapter()}, store=store)
    call = asyncio.ensure_future(gw.call("s", "x"))
    canceller = asyncio.ensure_future(cancel_at(clock, call, 1.0))  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await call  # not the ValueError: the cancellation wins
    await canceller
    await clock.sleep(10)
    assert (await gw.snapshot("s"))[0].permits_in_use == 0  # the release still completed


async def test_a_cancelled_attempt_gives_its_permit_back_as_neutral(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    """Neither a success nor a failure: the breaker and AIMD learn nothing from it, and
    the tokens reserved at admission are released with the permit."""
    store = RecordingStore(clock)
    source = ScriptedSource.always(clock, steps.ok(duration_s=100))
    config = make_config("chat", {"a": {"tpm": 10_000}})
    gw = own_store_gateway(config, {"a": source}, store=store)
    call = asyncio.ensure_future(gw.chat("s", [{"role": "user", "content": "x" * 400}]))
    canceller = asyncio.ensure_future(cancel_at(clock, call, 50.0))  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await call
    await canceller
    ((request,), (grant,)) = store.requests, store.grants
    assert request.est_tokens > 0
    assert store.settlements == [
        Settlement(
            scope="s",
            source=gw.plan("s").terms["a"],
            permit_id=grant.permit_id,
            admitted_at=grant.admitted_at,
            effect=Effect.NEUTRAL,
            est_tokens=request.est_tokens,
        )
    ]
    await gw.aclose()


async def test_a_release_that_fails_is_logged_and_the_cancellation_passes_through(
    clock: VirtualClock, own_store_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = RecordingStore(clock, settle_fails=True)
    source = ScriptedSource.always(clock, steps.ok(duration_s=100))
    gw = own_store_gateway(make_config("chat"), {"a": source}, store=store)
    call = asyncio.ensure_future(gw.call("s", "x"))
    canceller = asyncio.ensure_future(cancel_at(clock, call, 50.0))  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError), caplog.at_level(logging.WARNING):
        await call
    await canceller
    (record,) = [r for r in caplog.records if "releasing" in r.getMessage()]
    assert record.getMessage() == (
        "scope 's': releasing a permit of 'a' failed; it returns when its lease expires"
    )
    assert record.exc_info
    assert isinstance(record.exc_info[1], GovernanceBackendError)
    await gw.aclose()
