"""An outage is waiting, not the request's failure (SPEC §3 rule 15), with default settings.

Every source of the scope down for longer than the stall window: every call ends
`stalled` (its task defers), however many are in flight, and whether the source
refuses connections, answers 5xx or times out. A request whose failures are its
own (the source keeps serving other calls) still ends `retry_exhausted`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polygate_celery import AllSourcesExhausted
from polygate_celery.core.outcome import Outcome
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, make_config

CONCURRENCY = (1, 4, 8, 16, 200)


class Refusing:
    """A source whose connections are refused (a transient failure that takes no time)."""

    def __init__(self) -> None:
        self.attempts = 0

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        self.attempts += 1
        return Outcome.transient("connection refused")


class DownUntil:
    """A source that answers 503 until `back_at`, then serves."""

    def __init__(self, clock: VirtualClock, back_at: float) -> None:
        self.clock, self.back_at = clock, back_at

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        await self.clock.sleep(0.2)
        if self.clock.now() < self.back_at:
            return Outcome.transient("service unavailable", status=503)
        return Outcome.success(payload)


class BadForOne:
    """A source that serves every request but one, which it answers 500."""

    def __init__(self, clock: VirtualClock, bad: str) -> None:
        self.clock, self.bad = clock, bad
        self.bad_attempts = 0

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        await self.clock.sleep(0.2)
        if payload == self.bad:
            self.bad_attempts += 1
            return Outcome.transient("server error", status=500)
        return Outcome.success(payload)


async def verdicts(gateway_calls: list[Any]) -> list[str]:
    async def one(call: Any) -> str:
        try:
            await call
        except AllSourcesExhausted as exc:
            return exc.reason
        return "success"

    return list(await asyncio.gather(*(one(c) for c in gateway_calls)))


@pytest.mark.parametrize("calls", CONCURRENCY)
async def test_an_outage_of_503s_ends_every_call_stalled(
    clock: VirtualClock, gateway: GatewayFactory, calls: int
) -> None:
    """Chat with the scope gate, as a Celery worker runs it."""
    source = ScriptedSource.always(clock, steps.server_error(status=503))
    gw = gateway(make_config("chat"), {"a": source}, scope_gate=True)
    found = await verdicts([gw.call("s", f"p{n}") for n in range(calls)])
    assert found == ["stalled"] * calls


@pytest.mark.parametrize("scope_gate", [True, False], ids=["gate", "no-gate"])
@pytest.mark.parametrize("calls", [1, 16])
@pytest.mark.parametrize("kind", ["chat", "embedding"])
async def test_an_outage_ends_stalled_for_every_kind_gate_or_not(
    clock: VirtualClock, gateway: GatewayFactory, calls: int, scope_gate: bool, kind: str
) -> None:
    source = ScriptedSource.always(clock, steps.server_error(status=503))
    gw = gateway(make_config(kind), {"a": source}, scope_gate=scope_gate)
    found = await verdicts([gw.call("s", f"p{n}") for n in range(calls)])
    assert found == ["stalled"] * calls


@pytest.mark.parametrize("calls", [1, 4, 16])
async def test_refused_connections_end_every_call_stalled(
    clock: VirtualClock, gateway: GatewayFactory, calls: int
) -> None:
    source = Refusing()
    gw = gateway(make_config("chat"), {"a": source}, scope_gate=True)
    found = await verdicts([gw.call("s", f"p{n}") for n in range(calls)])
    assert found == ["stalled"] * calls
    # The breaker keeps the outage cheap: a first attempt or two a call, then probes.
    # A first attempt and its one same-source retry a call, then probes: about one per
    # breaker cooldown (10 s) fleet-wide over the stall window (300 s).
    assert source.attempts <= 3 * calls + 300 / 10 + 5


@pytest.mark.parametrize("calls", [1, 16])
async def test_an_outage_of_timeouts_defers_every_call(
    clock: VirtualClock, gateway: GatewayFactory, calls: int
) -> None:
    """Timeouts stay productive (a single timeout never makes a stall, rule 5), so a
    call may reach its deadline before its stall window: it defers either way."""
    source = ScriptedSource.always(clock, steps.timeout())
    gw = gateway(make_config("chat", {"a": {"timeout_s": 30}}), {"a": source}, scope_gate=True)
    found = await verdicts([gw.call("s", f"p{n}") for n in range(calls)])
    assert set(found) <= {"stalled", "deadline"}
    assert "retry_exhausted" not in found


async def test_a_mixed_outage_ends_stalled(clock: VirtualClock, gateway: GatewayFactory) -> None:
    script = [steps.server_error(status=502), steps.timeout(), steps.server_error(status=503)]
    source = ScriptedSource(clock, iter(script * 1000))
    gw = gateway(make_config("chat", {"a": {"timeout_s": 10}}), {"a": source}, scope_gate=True)
    assert await verdicts([gw.call("s", f"p{n}") for n in range(8)]) == ["stalled"] * 8


async def test_the_calls_succeed_once_the_source_is_back(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = DownUntil(clock, back_at=400.0)
    gw = gateway(make_config("chat"), {"a": source}, scope_gate=True)
    assert await verdicts([gw.call("s", f"p{n}") for n in range(16)]) == ["stalled"] * 16
    clock.advance(400 - clock.now() + 60)  # the source is back; its deferred tasks run again
    assert (await gw.call("s", "probe")).value == "probe"  # through the scope gate: reopens it
    assert await verdicts([gw.call("s", f"q{n}") for n in range(16)]) == ["success"] * 16


async def test_a_request_that_fails_while_its_source_serves_others_is_retry_exhausted(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = BadForOne(clock, bad="poison")
    gw = gateway(make_config("chat"), {"a": source}, scope_gate=True)

    async def traffic() -> None:
        for n in range(60):
            await gw.call("s", f"ok{n}")
            await clock.sleep(1)

    background = asyncio.ensure_future(traffic())
    await clock.sleep(0.5)  # the scope is serving when the request comes
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "poison")
    background.cancel()
    assert caught.value.reason == "retry_exhausted"
    # max_attempts (3, the default) charged; a first failure before any other call was
    # served since this one began is not.
    burned = [a for a in caught.value.trail if a.burned_budget]
    assert len(burned) == 3
    assert source.bad_attempts <= 4


async def test_a_lone_request_that_always_fails_defers(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Nothing tells a lone request's own failure from an outage: it defers, and the
    deferral budget bounds it."""
    source = BadForOne(clock, bad="poison")
    gw = gateway(make_config("chat"), {"a": source}, scope_gate=True)
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "poison")
    assert caught.value.reason == "stalled"
