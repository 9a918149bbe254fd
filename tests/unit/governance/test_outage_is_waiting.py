"""An outage is waiting, not the request's failure (SPEC §3 rule 15), with default settings,
in a governed Celery task (``caller="task"``: it parks); a direct caller's side of the rule
is in `test_direct_caller.py`.

Every source of the scope down for longer than the stall window: every call ends
`stalled` (its task defers), however many are in flight, and whether the source
refuses connections, answers 5xx or times out. A request whose failures are its
own (the source keeps serving other calls) still ends `retry_exhausted`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
from collections import Counter
from typing import Any

import pytest

from polygate_celery import AllSourcesExhausted, Store
from polygate_celery.core.outcome import Outcome
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, make_config
from tests.unit.governance.outage_sources import DownBetween

CONCURRENCY = (1, 4, 8, 16, 200)


@pytest.fixture
def gateway(gateway: GatewayFactory) -> GatewayFactory:
    """A gateway as a Celery worker builds it: its callers are tasks, which park."""
    return functools.partial(gateway, caller="task")


class Refusing:
    """A source whose connections are refused (a transient failure that takes no time)."""

    def __init__(self) -> None:
        self.attempts = 0

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        self.attempts += 1
        return Outcome.transient("connection refused")


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


@pytest.mark.timeout(600)  # 200 calls' steps on a real Redis: minutes on a busy machine
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
@pytest.mark.parametrize("timeout_s", [30, 60])
async def test_an_outage_of_timeouts_ends_every_call_stalled(
    clock: VirtualClock, gateway: GatewayFactory, calls: int, timeout_s: int
) -> None:
    """A call's first timeout stays productive (a single timeout never makes a stall,
    rule 5); the outage's later ones are waiting."""
    source = ScriptedSource.always(clock, steps.timeout())
    config = make_config("chat", {"a": {"timeout_s": timeout_s}})
    gw = gateway(config, {"a": source}, scope_gate=True)
    assert await verdicts([gw.call("s", f"p{n}") for n in range(calls)]) == ["stalled"] * calls


async def test_a_single_long_failure_never_makes_a_stall_verdict(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """The seed's second example with a gateway's 504 at the deadline instead of a
    timeout: the call's first failure keeps its time productive."""
    source = ScriptedSource(
        clock, iter([steps.server_error(status=504, duration_s=300), steps.ok("late")])
    )
    config = make_config("chat", {"a": {"timeout_s": 300}}, stall_window_s=300)
    result = await gateway(config, {"a": source}).call("s", "x")
    assert result.value == "late"


async def test_an_outage_that_begins_while_calls_are_in_flight_fails_none_of_them(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """200 calls, 8 served at a time until the source goes down at 10 s: a call in
    flight is charged at most one failure after the outage begins."""
    config = make_config("chat", {"a": {"max_concurrency": 8}})
    gw = gateway(config, {"a": DownBetween(clock, 10.0, math.inf, latency_s=0.5)}, scope_gate=True)
    found = Counter(await verdicts([gw.call("s", f"p{n}") for n in range(200)]))
    assert set(found) == {"success", "stalled"}
    assert found["success"] >= 100


async def test_progress_from_before_the_call_is_no_evidence_of_serving(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    """The scope succeeded 10 s before the call began (well within the stall window),
    then went down: the call's failures are still the outage's."""
    source = ScriptedSource(clock, iter([steps.ok(), *[steps.server_error(status=503)] * 200]))
    gw = gateway(make_config("chat"), {"a": source}, scope_gate=True)
    await gw.call("s", "earlier")
    clock.advance(10)
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")
    assert caught.value.reason == "stalled"
    assert not any(a.burned_budget for a in caught.value.trail)


async def test_an_outage_backs_off_exponentially(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """A breaker that never opens leaves the backoff alone to pace the call: the gaps
    double (halved at u = 0) up to backoff_max_s."""
    source = Refusing()
    config = make_config("chat", {"a": {"breaker": {"failure_threshold": 1000}}})
    gw = gateway(config, {"a": source}, scope_gate=True)
    sent: list[float] = []
    original = source.send

    async def timed(payload: Any, *, timeout_s: float) -> Outcome:
        sent.append(clock.now())
        return await original(payload, timeout_s=timeout_s)

    source.send = timed  # type: ignore[method-assign]
    assert await verdicts([gw.call("s", "x")]) == ["stalled"]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(sent)]
    # the first failure is retried once on the source (same_source_retries), then 2, 4...
    assert gaps[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]


async def test_a_mixed_outage_ends_stalled(clock: VirtualClock, gateway: GatewayFactory) -> None:
    script = [steps.server_error(status=502), steps.timeout(), steps.server_error(status=503)]
    source = ScriptedSource(clock, iter(script * 1000))
    gw = gateway(make_config("chat", {"a": {"timeout_s": 10}}), {"a": source}, scope_gate=True)
    assert await verdicts([gw.call("s", f"p{n}") for n in range(8)]) == ["stalled"] * 8


async def test_the_calls_succeed_once_the_source_is_back(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = DownBetween(clock, 0.0, 400.0, latency_s=0.2)
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
