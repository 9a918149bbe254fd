"""Calls waiting for a source's permits are served by class, then by their tenants'
weighted share (SPEC §8), whichever store holds the queues: governed calls through
the gateway, on virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polygate_celery import AllSourcesExhausted, Gateway, parse_config
from polygate_celery.config import GatewayConfig
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory

ANSWER_S = 10.0


def classes(**settings: Any) -> GatewayConfig:
    """One permit at source "a"; classes interactive > batch."""
    return parse_config(
        {
            "sources": {"a": {"max_concurrency": 1, "timeout_s": 60}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"], "stall_window_s": 600}},
            "priorities": {"interactive": {}, "batch": {"default": True, **settings}},
            "tenants": {"big": {"weight": 3}},
        }
    )


async def held(
    clock: VirtualClock, gateway: GatewayFactory
) -> tuple[ScriptedSource, Gateway, list[asyncio.Future[Any]]]:
    """A gateway over "a" (one permit, each answer `ANSWER_S`), the permit held by a
    first call: the calls made next wait."""
    source = ScriptedSource.always(clock, steps.ok(duration_s=ANSWER_S))
    gw = gateway(classes(), {"a": source})
    calls: list[asyncio.Future[Any]] = [asyncio.ensure_future(gw.call("s", "holder"))]
    await clock.sleep(0.5)
    return source, gw, calls


async def backlog_then_urgent(
    clock: VirtualClock, gw: Gateway, calls: list[asyncio.Future[Any]], n: int, every_s: float
) -> None:
    """`n` batch calls `every_s` apart, then one interactive call; all of them ended."""
    for i in range(n):
        calls.append(asyncio.ensure_future(gw.call("s", f"batch{i}")))
        await clock.sleep(every_s)
    calls.append(asyncio.ensure_future(gw.call("s", "urgent", priority="interactive")))
    await asyncio.gather(*calls)


async def test_an_interactive_call_overtakes_a_waiting_batch_backlog(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source, gw, calls = await held(clock, gateway)
    await backlog_then_urgent(clock, gw, calls, 3, 0.5)
    sent = [entry.payload for entry in source.journal]
    assert sent == ["holder", "urgent", "batch0", "batch1", "batch2"]
    await gw.aclose()


async def test_backlogged_tenants_are_served_by_weight(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source, gw, calls = await held(clock, gateway)
    for i in range(6):
        for tenant in ("big", "small"):
            call = gw.call("s", f"{tenant}{i}", tenant=tenant, est_tokens=100)
            calls.append(asyncio.ensure_future(call))
    await asyncio.gather(*calls)
    served = [entry.payload for entry in source.journal][1:9]
    assert sum(1 for p in served if p.startswith("big")) == 6  # 3:1 of the first eight
    await gw.aclose()


async def test_a_call_starved_by_a_higher_class_stalls_while_the_scope_lives(
    clock: VirtualClock, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Interactive calls keep the only permit busy: the scope makes progress, its batch
    call none. The batch call's stall verdict reads its class's progress, so it gives
    up stalled within its window (a task then parks) instead of waiting to its deadline;
    the scope's gate stays open to the interactive calls."""
    source = ScriptedSource.always(clock, steps.ok(duration_s=ANSWER_S))
    config = parse_config(
        {
            "sources": {"a": {"max_concurrency": 1, "timeout_s": 60}},
            "scopes": {
                "s": {
                    "kind": "chat",
                    "sources": ["a"],
                    "stall_window_s": 30,
                    "max_call_s": 3600,
                }
            },
            "priorities": {"interactive": {}, "batch": {"default": True}},
        }
    )
    gw = gateway(config, {"a": source}, scope_gate=True)
    stop = asyncio.Event()

    async def interactive() -> None:
        while not stop.is_set():
            await gw.call("s", "urgent", priority="interactive")

    streams = [asyncio.ensure_future(interactive()) for _ in range(2)]
    await clock.sleep(1.0)
    started = clock.now()
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "batch")
    assert verdict.value.reason == "stalled"
    assert verdict.value.starved_class == "batch"  # no outage: a task parks for its class
    assert clock.now() - started <= 30 + 2 * ANSWER_S
    assert not [r for r in caplog.records if "gate closed" in r.getMessage()]
    stop.set()
    await asyncio.gather(*streams)
    assert "batch" not in [entry.payload for entry in source.journal]
    await gw.aclose()


async def test_an_interactive_call_overtakes_batch_calls_waiting_for_the_quota(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """A quota (6 RPM as a bucket: six at once, then a slot every 10 s) binds, not the
    permits: the batch calls beyond its burst have booked its next slots. An interactive
    call takes the soonest of them and is sent next; the batch call it was taken from
    keeps its place in its class: it takes the next batch call's slot, that one the
    next's, and the last books anew (first come, first served within a class)."""
    source = ScriptedSource.always(clock, steps.ok(duration_s=0.1))
    config = parse_config(
        {
            "sources": {"a": {"max_concurrency": 16, "rpm": 6, "timeout_s": 60}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"], "stall_window_s": 600}},
            "priorities": {"interactive": {}, "batch": {"default": True}},
        }
    )
    gw = gateway(config, {"a": source})
    await backlog_then_urgent(clock, gw, [], 9, 0.1)
    sent = [entry.payload for entry in source.journal]
    assert sent[:6] == [f"batch{i}" for i in range(6)], sent  # the bucket's burst
    assert sent[6:] == ["urgent", "batch6", "batch7", "batch8"], sent  # batch6's slot taken
    await gw.aclose()


async def test_a_tenants_call_overtakes_calls_of_a_tenant_ahead_of_its_share(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Tenants share a quota's slots by weight (SPEC §8). Tenant x's calls beyond the
    bucket's burst have booked its next slots, tagged 1, 2 and 3 (a call each, weight
    1); a call of tenant y (weight 4) is tagged 0.25: it takes the soonest, and each x
    call finding its slot gone at its time takes the next x call's, tagged after it."""
    source = ScriptedSource.always(clock, steps.ok(duration_s=0.1))
    config = parse_config(
        {
            "sources": {"a": {"max_concurrency": 16, "rpm": 6, "timeout_s": 60}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"], "stall_window_s": 600}},
            "tenants": {"x": {"weight": 1}, "y": {"weight": 4}},
        }
    )
    gw = gateway(config, {"a": source})
    calls = []
    for i in range(9):
        calls.append(asyncio.ensure_future(gw.call("s", f"x{i}", tenant="x")))
        await clock.sleep(0.1)
    calls.append(asyncio.ensure_future(gw.call("s", "y0", tenant="y")))
    await asyncio.gather(*calls)
    sent = [entry.payload for entry in source.journal]
    assert sent[:6] == [f"x{i}" for i in range(6)], sent  # the bucket's burst
    assert sent[6:] == ["y0", "x6", "x7", "x8"], sent
    await gw.aclose()


async def test_a_stall_of_every_class_is_an_outage_not_a_starvation(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Classes declared, the only source down: a batch call's stall verdict finds the
    scope stalled too. It is an outage: no class starved it, and the gate closes."""
    source = ScriptedSource.always(clock, steps.server_error(duration_s=1.0))
    gw = gateway(classes(), {"a": source}, scope_gate=True)
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "batch")
    assert verdict.value.reason == "stalled"
    assert verdict.value.starved_class is None
    assert await gw.store.gate_closed_for_s("s") > 0
    await gw.aclose()
