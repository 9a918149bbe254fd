"""Waiting for a runnable source, Retry-After pauses, fail_fast, the deadline and retry_after_s."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from polygate_celery import AllSourcesExhausted, ConfigError, Gateway, Store
from polygate_celery.store import AdmitRequest, Denial, Grant
from polygate_celery.telemetry import WaitEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, Recorder, make_config, until


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
    await until(lambda: source.attempts == 1)
    second = await gw.call("s", "B")
    await first

    assert second.attempts[0].started_s == 3.0  # not 5.0, the end of its first poll


async def test_fail_fast_raises_at_once_with_the_known_reopening(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
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
        # A hint beyond the cap pauses the source only up to the cap.
        pytest.param(10_000, 600, 600 - 11, id="hint-clamped-to-cap"),
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
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
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


async def test_an_attempt_cut_by_the_deadline_is_a_deadline_not_a_source_failure(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """The last allowed attempt, cut short by max_call_s, must not read as retry_exhausted."""
    source = ScriptedSource.always(clock, steps.ok(duration_s=30))
    config = make_config(
        "chat",
        {"a": {"timeout_s": 60, "breaker": {"failure_threshold": 1}}},
        max_attempts=1,
        max_call_s=10,
    )
    gw = gateway(config, {"a": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")

    assert (caught.value.reason, clock.now()) == ("deadline", 10.0)
    (snapshot,) = await gw.snapshot("s")
    assert (snapshot.breaker, snapshot.permit_limit) == ("closed", 8)  # no penalty


async def test_a_reopening_that_has_passed_is_no_longer_an_estimate(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource(
        clock,
        itertools.chain(
            [steps.rate_limited(retry_after_s=2)], itertools.repeat(steps.rate_limited())
        ),
    )
    gw = gateway(make_config("chat", stall_window_s=10), {"a": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")

    assert caught.value.reason == "stalled"
    assert caught.value.retry_after_s == 10.0  # nothing known: the stall window


@pytest.mark.parametrize("hint", [float("nan"), float("inf"), -5.0])
async def test_an_unusable_retry_after_hint_is_ignored(
    clock: VirtualClock, gateway: GatewayFactory, hint: float
) -> None:
    source = ScriptedSource(clock, [steps.rate_limited(retry_after_s=hint), steps.ok("y")])
    gw = gateway(make_config("chat"), {"a": source})

    assert (await gw.call("s", "x")).value == "y"
    assert (await gw.snapshot("s"))[0].paused_for_s == 0.0


async def test_a_release_just_after_the_refusal_still_wakes_the_waiter(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """B is refused at t=5 in the same instant A releases: B is served at 5, not 10."""
    source = ScriptedSource(clock, [steps.ok("A", duration_s=5), steps.ok("B")])
    config = make_config("chat", {"a": {"max_concurrency": 1}}, poll_interval_s=10)
    gw = gateway(config, {"a": source})

    async def later_call() -> float:
        await clock.sleep(5)
        await gw.call("s", "B")
        return clock.now()

    second = asyncio.ensure_future(later_call())
    await asyncio.sleep(0)
    await gw.call("s", "A")
    assert await second == 5.0


async def test_a_success_without_reported_usage_keeps_its_token_estimate(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """TPM 1000, ten calls of 600 estimated tokens: 6000 tokens, a minute's burst, then 300 s."""
    source = ScriptedSource.always(clock, steps.ok(tokens=None))
    gw = gateway(make_config("chat", {"a": {"tpm": 1000}}), {"a": source})
    for _ in range(10):
        await gw.call("s", "x", est_tokens=600)
    assert clock.now() == pytest.approx(300.0, abs=1.0)  # not 0: the estimate was charged


async def test_a_verdict_waiting_for_a_retry_after_says_it_is_a_rate_limit_reset(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.rate_limited(retry_after_s=60))
    gw = gateway(make_config("chat", stall_window_s=10, poll_interval_s=1), {"a": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")

    assert (caught.value.reason, caught.value.rate_limited) == ("stalled", True)


async def test_a_verdict_waiting_for_a_quota_says_it_is_a_rate_limit_reset(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.ok())
    gw = gateway(make_config("chat", {"a": {"rpm": 1}}), {"a": source})
    await gw.call("s", "first")

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "second", fail_fast=True)

    assert caught.value.rate_limited is True
    assert caught.value.retry_after_s == pytest.approx(60.0, abs=1.0)


async def test_a_verdict_waiting_for_a_breaker_is_only_an_estimate(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.server_error(status=503))
    config = make_config(
        "chat",
        {"a": {"breaker": {"failure_threshold": 1, "cooldown_s": 60}}},
        stall_window_s=10,
        max_attempts=5,
    )
    gw = gateway(config, {"a": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")

    assert (caught.value.reason, caught.value.rate_limited) == ("stalled", False)
    assert caught.value.retry_after_s > 10  # the cooldown's end: a probe, not a reset


async def test_a_call_queued_for_capacity_does_not_ask_again_at_each_poll(
    clock: VirtualClock, gateway: GatewayFactory, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused for capacity alone, B waits in the queue: its polls check the stall verdict
    only, the gateway keeps its place, and it asks again once handed the permit."""
    source = ScriptedSource(clock, [steps.ok("A", duration_s=30), steps.ok("B")])
    config = make_config("chat", {"a": {"max_concurrency": 1}}, poll_interval_s=1)
    recorder = Recorder()
    gw = gateway(config, {"a": source}, hooks=[recorder])
    answers: list[str] = []
    admit = store.admit

    async def counted(request: AdmitRequest) -> Grant | Denial:
        answer = await admit(request)
        answers.append(type(answer).__name__)
        return answer

    monkeypatch.setattr(store, "admit", counted)
    first = asyncio.ensure_future(gw.call("s", "A"))
    await until(lambda: source.attempts == 1)
    second = await gw.call("s", "B")
    await first

    assert second.attempts[0].started_s == 30.0
    assert answers == ["Grant", "Denial", "Grant"]
    polls = [e for e in recorder.of(WaitEvent) if e.cause == "no_runnable"]
    assert len(polls) >= 30  # each a stall check
