"""Calls waiting for a quota are served first come, first served within their class,
across retries (SPEC §8), whichever store holds the bookings: governed calls through
the gateway, on virtual time."""

from __future__ import annotations

import asyncio
import itertools

from polygate_celery import parse_config
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory


async def test_a_call_whose_attempt_failed_keeps_its_place_on_the_quota(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """6 RPM as a bucket: six at once, then a slot every 10 s. The first call's attempt
    fails (a 503); five calls after it take the rest of the burst, and three more book
    the next slots. Asking again, the first call takes the soonest of those slots (it
    came before them all), and each call robbed takes the next one's."""
    failed_once = itertools.chain(
        [steps.server_error(status=503, duration_s=0.1)], itertools.repeat(steps.ok())
    )
    source = ScriptedSource(clock, failed_once)
    config = parse_config(
        {
            "sources": {"a": {"max_concurrency": 16, "rpm": 6, "timeout_s": 60}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"], "stall_window_s": 600}},
        }
    )
    gw = gateway(config, {"a": source})
    calls = [asyncio.ensure_future(gw.call("s", "first"))]
    for i in range(8):
        await clock.sleep(0.01)
        calls.append(asyncio.ensure_future(gw.call("s", f"later{i}")))
    await asyncio.gather(*calls)
    sent = [entry.payload for entry in source.journal]
    later = [f"later{i}" for i in range(8)]
    assert sent == ["first", *later[:5], "first", *later[5:]], sent
    await gw.aclose()
