"""A tenant's caps, through the gateway (SPEC §8): its calls wait while it is at one of
them, whichever store holds them, and the provider never sees it over; a call its caps
hold back for its whole stall window is stalled, however well the scope serves the
other tenants. On virtual time."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from polygate_celery import AllSourcesExhausted, parse_config
from polygate_celery.config import GatewayConfig
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory

ANSWER_S = 10.0


def capped(stall_window_s: float = 600.0, **caps: Any) -> GatewayConfig:
    """Source "a" (8 permits); tenant "acme" capped as `caps`, every other tenant not."""
    return parse_config(
        {
            "sources": {"a": {"max_concurrency": 8, "timeout_s": 200}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"], "stall_window_s": stall_window_s}},
            "tenants": {"acme": caps},
        }
    )


def most_in_flight(source: ScriptedSource, prefix: str, answer_s: float = ANSWER_S) -> int:
    """The most requests of payloads starting with `prefix` the source had at once."""
    starts = sorted(entry.at for entry in source.journal if str(entry.payload).startswith(prefix))
    return max((sum(1 for s in starts if s <= t < s + answer_s) for t in starts), default=0)


async def test_a_tenant_never_has_more_calls_in_flight_than_its_cap(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.ok(duration_s=ANSWER_S))
    gw = gateway(capped(max_concurrency=2), {"a": source})
    calls = [gw.call("s", f"acme{i}", tenant="acme") for i in range(6)]
    calls += [gw.call("s", f"beta{i}", tenant="beta") for i in range(3)]
    results = await asyncio.gather(*calls)
    assert len(results) == 9
    assert most_in_flight(source, "acme") == 2  # its cap, used
    assert most_in_flight(source, "beta") == 3  # another tenant is not held back
    assert clock.now() < 3 * ANSWER_S + 5  # three rounds of two, each as the last ends
    await gw.aclose()


async def test_a_tenants_rpm_paces_its_requests_at_the_provider(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.ok(duration_s=0.1))
    gw = gateway(capped(rpm=6), {"a": source})  # a request every 10 s, after a burst of 5
    await asyncio.gather(*(gw.call("s", f"acme{i}", tenant="acme") for i in range(8)))
    starts = sorted(entry.at for entry in source.journal)
    assert len(starts) == 8
    # every 60 s window holds at most a burst and a window's refill: 5 + 6
    assert all(sum(1 for t in starts if s <= t < s + 60) <= 11 for s in starts)
    gaps = [b - a for a, b in itertools.pairwise(starts[5:])]
    assert all(gap >= 10 - 1e-6 for gap in gaps)  # then one per refill
    await gw.aclose()


async def test_a_call_held_back_by_its_tenants_cap_for_its_stall_window_is_stalled(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    long = ScriptedSource(clock, [steps.ok(duration_s=500.0), *[steps.ok(duration_s=1.0)] * 40])
    gw = gateway(capped(stall_window_s=30.0, max_concurrency=1), {"a": long})
    first = asyncio.ensure_future(gw.call("s", "acme-long", tenant="acme"))
    await clock.sleep(0.5)

    async def beta() -> None:  # the scope serves another tenant all the while
        for i in range(25):
            await gw.call("s", f"beta{i}", tenant="beta")
            await clock.sleep(1.0)

    others = [asyncio.ensure_future(beta())]
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "acme-waits", tenant="acme")
    assert caught.value.reason == "stalled"
    assert 30.0 < clock.now() < 40.0  # its stall window, though beta's calls succeed
    assert caught.value.retry_after_s == pytest.approx(30.0)  # no known end: the window
    await asyncio.gather(first, *others)
    await gw.aclose()


async def test_a_call_its_tenants_cap_stalled_leaves_the_scope_open_to_the_others(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """A caller that parks closes its scope's gate on a stalled verdict (`scope_gate`), an
    outage's; a call its tenant's caps stalled is no outage: the gate stays open."""
    long = ScriptedSource(clock, [steps.ok(duration_s=500.0), *[steps.ok(duration_s=1.0)] * 5])
    config = capped(stall_window_s=30.0, max_concurrency=1)
    gw = gateway(config, {"a": long}, scope_gate=True)
    first = asyncio.ensure_future(gw.call("s", "acme-long", tenant="acme"))
    await clock.sleep(0.5)
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "acme-waits", tenant="acme")
    assert (caught.value.reason, caught.value.capped_tenant) == ("stalled", "acme")
    assert caught.value.starved_class is None
    # at once, all of them: no gate closed (which would let one through, as its probe)
    await asyncio.gather(*(gw.call("s", f"beta{i}", tenant="beta") for i in range(3)))
    assert clock.now() < 30.5 + 2.0
    first.cancel()
    await gw.aclose()


async def test_a_cancelled_attempt_gives_its_tokens_back_to_its_tenant(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """An attempt that did not finish used none of its estimate: the tenant's tpm gets it
    back, as the source's quota does."""
    source = ScriptedSource(clock, [steps.ok(duration_s=100.0), steps.ok(duration_s=1.0)])
    gw = gateway(capped(tpm=6000), {"a": source})  # 100 tokens a second
    cancelled = asyncio.ensure_future(gw.call("s", "first", tenant="acme", est_tokens=3000))
    await clock.sleep(1.0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    started = clock.now()
    await gw.call("s", "second", tenant="acme", est_tokens=5000)  # room for it at once
    assert source.journal[-1].at - started < 1.0
    await gw.aclose()
