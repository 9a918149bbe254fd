"""Waiting for a runnable source, Retry-After pauses, fail_fast, the deadline and retry_after_s."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from polygate_celery import AllSourcesExhausted, ConfigError, Gateway, MemoryStore
from polygate_celery.telemetry import WaitEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, Recorder, make_config


async def test_retry_after_pauses_the_source_and_another_serves_meanwhile(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    a = ScriptedSource(clock, [steps.rate_limited(retry_after_s=60)])
    b = ScriptedSource.always(clock, steps.ok("b"))
    gw = gateway(make_config("chat", {"a": {}, "b": {}}), {"a": a, "b": b})

    result = await gw.call("s", "x")

    assert result.source == "b"
    assert clock.now() == 1.0  # one base-tier backoff, no wait for a's pause
    assert (await gw.snapshot("s"))[0].paused_for_s == 59.0


async def test_retry_after_is_waited_out_by_polling_not_one_long_sleep(
    clock: VirtualClock, gateway: GatewayFactory, recorder: Recorder
) -> None:
    source = ScriptedSource(clock, [steps.rate_limited(retry_after_s=30), steps.ok("late")])
    gw = gateway(make_config("chat", poll_interval_s=1), {"a": source})

    result = await gw.call("s", "x")

    assert result.value == "late"
    assert result.attempts[1].started_s >= 30.0  # the effective wait is at least the hint
    polls = [e for e in recorder.of(WaitEvent) if e.cause == "no_runnable"]
    assert len(polls) >= 50  # 0.5 s polls, each one a stall check
    assert all(e.blocked == (("a", "paused"),) for e in polls)


async def test_a_released_permit_wakes_the_waiter_before_its_next_poll(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource(clock, itertools.repeat(steps.ok(duration_s=3)))
    config = make_config("chat", {"a": {"max_concurrency": 1}}, poll_interval_s=10)
    gw = gateway(config, {"a": source})

    first = asyncio.ensure_future(gw.call("s", "A"))
    await asyncio.sleep(0)
    second = await gw.call("s", "B")
    await first

    assert second.attempts[0].started_s == 3.0  # not 5.0, the end of its first poll


async def test_fail_fast_raises_at_once_with_the_known_reopening(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    store = MemoryStore(clock)
    source = ScriptedSource.always(clock, steps.ok())
    gw = gateway(make_config(), {"a": source}, store=store)
    await store.pause_source("a", 42)

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x", fail_fast=True)

    assert (caught.value.reason, caught.value.retry_after_s) == ("fail_fast", 42.0)
    assert (clock.now(), source.attempts) == (0.0, 0)


async def test_fail_fast_does_not_stop_a_call_that_can_run(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    gw = gateway(make_config(), {"a": ScriptedSource.always(clock, steps.ok("y"))})
    assert (await gw.call("s", "x", fail_fast=True)).value == "y"


async def test_deadline_cuts_attempts_and_waits(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.timeout())
    config = make_config("chat", {"a": {"timeout_s": 30}}, max_call_s=50, max_attempts=5)
    gw = gateway(config, {"a": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")

    assert caught.value.reason == "deadline"
    assert clock.now() == 50.0
    assert [s.timeout_s for s in source.journal] == [30.0, 19.0]  # the second cut to the deadline


async def test_default_deadline_is_attempts_times_timeout_plus_two_windows(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    config = make_config(
        "chat", {"a": {"timeout_s": 10}, "b": {"timeout_s": 40}}, stall_window_s=100, max_attempts=2
    )
    gw = gateway(config, {n: ScriptedSource.always(clock, steps.ok()) for n in "ab"})
    assert gw.plan("s").max_call_s == 2 * 40 + 2 * 100


@pytest.mark.parametrize(
    ("retry_after_s", "cap", "expected"),
    [
        pytest.param(1_000, 3_600, 1_000 - 11, id="soonest-known-reopening"),
        pytest.param(10_000, 600, 600, id="clamped-to-cap"),
        pytest.param(None, 3_600, 10, id="unknown-is-the-stall-window"),
    ],
)
async def test_retry_after_estimate(
    clock: VirtualClock,
    gateway: GatewayFactory,
    retry_after_s: float | None,
    cap: float,
    expected: float,
) -> None:
    """A chat 429 with a hint pauses the source; the stalled verdict reports its reopening."""
    source = ScriptedSource.always(clock, steps.rate_limited(retry_after_s=retry_after_s))
    config = make_config("chat", stall_window_s=10, retry_after_cap_s=cap, poll_interval_s=1)
    gw = gateway(config, {"a": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")

    assert caught.value.reason == "stalled"
    assert caught.value.retry_after_s == pytest.approx(expected, abs=1.0)


async def test_retry_after_is_at_least_one_poll_interval(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    store = MemoryStore(clock)
    gw = gateway(
        make_config(poll_interval_s=5), {"a": ScriptedSource.always(clock, steps.ok())}, store=store
    )
    await store.pause_source("a", 0.25)
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x", fail_fast=True)
    assert caught.value.retry_after_s == 5.0


async def test_unknown_scope_is_a_config_error(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    gw = gateway(make_config(), {"a": ScriptedSource.always(clock, steps.ok())})
    with pytest.raises(ConfigError, match="no scope named 'nope'"):
        await gw.call("nope", "x")


def test_a_scope_source_without_adapter_is_a_config_error(clock: VirtualClock) -> None:
    with pytest.raises(ConfigError) as caught:
        Gateway(make_config("chat", {"a": {}, "b": {}}), {"a": ScriptedSource(clock, [])})
    assert caught.value.field == "sources.b"
