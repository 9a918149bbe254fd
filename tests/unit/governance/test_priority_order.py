"""Calls waiting for a source's permits are served by class, then by their tenants'
weighted share (SPEC §8), whichever store holds the queues: governed calls through
the gateway, on virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

from polygate_celery import parse_config
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


async def test_an_interactive_call_overtakes_a_waiting_batch_backlog(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.ok(duration_s=ANSWER_S))
    gw = gateway(classes(), {"a": source})
    calls = [asyncio.ensure_future(gw.call("s", "holder"))]
    await clock.sleep(0.5)
    for i in range(3):
        calls.append(asyncio.ensure_future(gw.call("s", f"batch{i}")))
        await clock.sleep(0.5)
    calls.append(asyncio.ensure_future(gw.call("s", "urgent", priority="interactive")))
    await asyncio.gather(*calls)
    sent = [entry.payload for entry in source.journal]
    assert sent == ["holder", "urgent", "batch0", "batch1", "batch2"]
    await gw.aclose()


async def test_backlogged_tenants_are_served_by_weight(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.ok(duration_s=ANSWER_S))
    gw = gateway(classes(), {"a": source})
    calls = [asyncio.ensure_future(gw.call("s", "holder"))]
    await clock.sleep(0.5)
    for i in range(6):
        for tenant in ("big", "small"):
            call = gw.call("s", f"{tenant}{i}", tenant=tenant, est_tokens=100)
            calls.append(asyncio.ensure_future(call))
    await asyncio.gather(*calls)
    served = [entry.payload for entry in source.journal][1:9]
    assert sum(1 for p in served if p.startswith("big")) == 6  # 3:1 of the first eight
    await gw.aclose()
