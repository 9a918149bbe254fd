"""With the scope gate on, a stalled scope defers new calls at once, bar one probe."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polygate_celery import AllSourcesExhausted, Store
from polygate_celery.store import AdmitRequest, Denial, Grant, Settlement
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from polygate_celery.testing.scripted import Step
from tests.conftest import GatewayFactory, make_config


async def verdict_and_time(call: object, clock: VirtualClock) -> tuple[str, float]:
    started = clock.now()
    try:
        await call  # type: ignore[misc]
    except AllSourcesExhausted as exc:
        return exc.reason, clock.now() - started
    return "success", clock.now() - started


async def test_after_a_stall_new_calls_defer_at_once_while_one_probes(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    source = ScriptedSource.always(clock, steps.ok("back"))
    gw = gateway(make_config("chat", stall_window_s=10), {"a": source}, scope_gate=True)
    await store.pause_source("a", 40)

    first = await verdict_and_time(gw.call("s", "x"), clock)
    assert first[0] == "stalled"  # at ~10 s; the gate closes for the pause's remaining ~30 s

    # Which of two concurrent calls takes the probe is a race; exactly one does.
    probe, other = sorted(
        await asyncio.gather(
            verdict_and_time(gw.call("s", "one"), clock),
            verdict_and_time(gw.call("s", "two"), clock),
        ),
        key=lambda verdict: -verdict[1],
    )
    assert other == ("stalled", 0.0)  # deferred at once, no stall window spent
    assert probe[0] == "stalled"  # the probe waited its own window: still paused
    assert probe[1] > 0

    await store.pause_source("a", 0)
    clock.advance(60)  # past the gate and the pause
    assert (await gw.call("s", "y")).value == "back"


@pytest.mark.parametrize(("blocker", "reset"), [("pause", True), ("breaker", False)])
async def test_a_call_the_gate_refuses_inherits_whether_it_waits_for_a_reset(
    clock: VirtualClock, gateway: GatewayFactory, store: Store, blocker: str, reset: bool
) -> None:
    """Refused at once, it still knows whether the reopening is a rate-limit reset
    (no growth of its deferral) or an estimate such as a breaker's cooldown."""
    if blocker == "pause":
        source = ScriptedSource.always(clock, steps.ok())
        await store.pause_source("a", 40)
    else:
        source = ScriptedSource.always(clock, steps.server_error(status=503))
    config = make_config(
        "chat",
        {"a": {"breaker": {"failure_threshold": 1, "cooldown_s": 40}}},
        stall_window_s=10,
        max_attempts=5,
    )
    gw = gateway(config, {"a": source}, scope_gate=True)
    with pytest.raises(AllSourcesExhausted) as first:
        await gw.call("s", "x")
    assert first.value.rate_limited is reset

    async def verdict(prompt: str) -> tuple[float, AllSourcesExhausted]:
        started = clock.now()
        with pytest.raises(AllSourcesExhausted) as caught:
            await gw.call("s", prompt)
        return clock.now() - started, caught.value

    # Which of two concurrent calls takes the probe is a race; exactly one does.
    (took, other), (probe_took, _) = sorted(
        await asyncio.gather(verdict("one"), verdict("two")), key=lambda v: v[0]
    )
    assert (other.reason, took) == ("stalled", 0.0)  # refused by the gate, at once
    assert probe_took > 0
    assert other.rate_limited is reset


async def test_a_successful_probe_reopens_the_scope(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    source = ScriptedSource.always(clock, steps.ok("back"))
    gw = gateway(make_config("chat", stall_window_s=10), {"a": source}, scope_gate=True)
    await store.pause_source("a", 15)
    with pytest.raises(AllSourcesExhausted):
        await gw.call("s", "x")  # stalled at ~10 s; gate closed ~5 s
    await store.close_gate("s", 1_000)  # as if the scope's estimate were far away
    assert (await gw.call("s", "probe")).value == "back"  # waits out the pause, succeeds
    assert (await gw.call("s", "next")).value == "back"  # the gate is open again


async def test_without_the_gate_calls_wait_their_own_window(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    gw = gateway(make_config("chat", stall_window_s=10), {"a": ScriptedSource(clock, [])})
    await store.pause_source("a", 100)
    await store.close_gate("s", 100)
    reason, took = await verdict_and_time(gw.call("s", "x"), clock)
    assert reason == "stalled"
    assert took > 10


class ProbeCount:
    """A store that counts the probes in flight: permits granted to a gated call while the
    scope's gate was closed, until they settle."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.probing: set[str] = set()
        self.most = 0
        self.probes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def admit(self, request: AdmitRequest) -> Grant | Denial:
        # A closed gate cannot open meanwhile (no success, no time passes): a grant after
        # it was seen closed went through it.
        closed = request.gate and await self.store.gate_closed_for_s(request.scope) > 0
        result = await self.store.admit(request)
        if closed and isinstance(result, Grant):
            self.probing.add(result.permit_id)
            self.probes += 1
            self.most = max(self.most, len(self.probing))
        return result

    async def settle(self, settlement: Settlement) -> bool:
        self.probing.discard(settlement.permit_id)
        return await self.store.settle(settlement)


async def test_verdicts_of_calls_already_running_leave_one_probe_in_flight(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    """Calls that were running when the scope stalled reach their own verdicts after
    their backoffs, each closing the gate again: the probe in flight keeps its slot."""
    counted = ProbeCount(store)
    refusing = Step("server_error", 3.0, reason="connection refused")
    config = make_config(
        "chat",
        {"a": {"breaker": {"failure_threshold": 1_000}}},
        stall_window_s=10,
        max_attempts=100,
    )
    gw = gateway(config, {"a": ScriptedSource.always(clock, refusing)}, store=counted,
                 scope_gate=True)  # fmt: skip

    async def call(n: int) -> str:
        await clock.sleep(1.5 * n)  # arriving before and after the stall
        try:
            await gw.call("s", f"task {n}")
        except AllSourcesExhausted as exc:
            return exc.reason
        return "success"

    verdicts = await asyncio.gather(*(call(n) for n in range(20)))
    assert set(verdicts) == {"stalled"}
    assert counted.probes >= 1
    assert counted.most == 1
    await gw.aclose()


async def test_a_call_the_gate_refuses_names_the_closing_verdicts_last_error(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.server_error(status=503))
    gw = gateway(make_config("chat", stall_window_s=10), {"a": source}, scope_gate=True)
    with pytest.raises(AllSourcesExhausted) as closing:
        await gw.call("s", "x")
    assert closing.value.reason == "stalled"
    assert closing.value.last_error is not None
    assert closing.value.last_error.startswith("a: transient (HTTP 503)")
    verdicts = await asyncio.gather(
        gw.call("s", "one"), gw.call("s", "two"), return_exceptions=True
    )
    refused = [v for v in verdicts if isinstance(v, AllSourcesExhausted) and v.attempts == 0]
    assert len(refused) == 1  # the other probed
    assert refused[0].reason == "stalled"
    assert refused[0].last_error == closing.value.last_error
