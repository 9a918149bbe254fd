"""The seed's acceptance table and the single-timeout regression (SPEC §3), in virtual time."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from polygate_celery import AllSourcesExhausted, Store
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, make_config

QUEUEING = {"timeout_s": 300}
WINDOWS = {"stall_window_s": 300, "backoff_base_s": 2}


async def test_queueing_gateway_chat_stalls_after_one_attempt_and_301_seconds(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Every request held for the whole timeout_s, then 429: one attempt, 301 s, stalled."""
    source = ScriptedSource.always(clock, steps.rate_limited(duration_s=300))
    gw = gateway(make_config("chat", {"gw": QUEUEING}, **WINDOWS), {"gw": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "prompt")

    assert caught.value.reason == "stalled"
    assert source.attempts == 1
    assert caught.value.attempts == 1
    assert clock.now() == 301.0
    assert caught.value.trail[0].burned_budget is False


@pytest.mark.parametrize("kind", ["embedding", "ocr"])
async def test_queueing_gateway_non_exempt_kinds_end_retry_exhausted(
    kind: str, clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.rate_limited(duration_s=300))
    gw = gateway(make_config(kind, {"gw": QUEUEING}, **WINDOWS), {"gw": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "page")

    assert caught.value.reason == "retry_exhausted"
    assert source.attempts == 3
    # 3 attempts of 300 s and backoffs of 1 s and 2 s in between.
    assert clock.now() == 903.0


@pytest.mark.parametrize("kind", ["chat", "embedding", "ocr"])
async def test_single_timeout_never_exhausts_the_stall_budget(
    kind: str, clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """stall_window_s == timeout_s == 300: attempt 1 times out, attempt 2 succeeds."""
    source = ScriptedSource(clock, [steps.timeout(), steps.ok("answer")])
    gw = gateway(make_config(kind, {"gw": QUEUEING}, **WINDOWS), {"gw": source})

    result = await gw.call("s", "prompt")

    assert result.value == "answer"
    assert [a.outcome for a in result.attempts] == ["transient", "success"]
    assert result.attempts[0].seconds == 300.0


@pytest.mark.parametrize("kind", ["embedding", "ocr"])
async def test_timeout_then_no_runnable_source_stalls_only_on_non_productive_time(
    kind: str, clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    """One timeout, then the only source is paused: no verdict until the wait passes 300 s."""
    source = ScriptedSource(clock, itertools.chain([steps.timeout()], itertools.repeat(steps.ok())))
    config = make_config(kind, {"gw": QUEUEING}, **WINDOWS, poll_interval_s=1)
    gw = gateway(config, {"gw": source}, store=store)

    async def pause_after_first_attempt() -> None:
        await clock.sleep(300.5)  # during the 1 s backoff that follows the timeout
        await store.pause_source("gw", 10_000)

    task = asyncio.ensure_future(pause_after_first_attempt())
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "page")
    await task

    assert caught.value.reason == "stalled"
    assert source.attempts == 1
    # 300 s productive; the verdict needs more than 300 s of non-productive time,
    # and comes at most one poll interval after it.
    stalled_s = clock.now() - 300.0
    assert 300.0 < stalled_s <= 301.0
