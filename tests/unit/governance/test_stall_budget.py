"""The design note's stall tests (seed §7.2): quadrants, productive time, 429 saturation."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from polygate_celery import AllSourcesExhausted, Store
from polygate_celery.telemetry import Event, WaitEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, Recorder, make_config, until

WINDOW = 300.0


async def keep_progress_fresh(clock: VirtualClock, store: Store, every_s: float) -> None:
    """Another worker's calls succeeding in the same scope."""
    while True:
        await store.mark_progress("s")
        await clock.sleep(every_s)


async def run_paused_call(
    clock: VirtualClock,
    gateway: GatewayFactory,
    store: Store,
    *,
    pause_s: float,
    progress_every_s: float | None,
) -> tuple[str, float]:
    """The only source is paused for `pause_s`; returns (verdict, end time)."""
    source = ScriptedSource.always(clock, steps.ok())
    config = make_config("chat", stall_window_s=WINDOW, max_call_s=10_000)
    gw = gateway(config, {"a": source}, store=store)
    await store.pause_source("a", pause_s)
    keeper = None
    if progress_every_s is not None:
        keeper = asyncio.ensure_future(keep_progress_fresh(clock, store, progress_every_s))
    try:
        await gw.call("s", "x")
        verdict = "success"
    except AllSourcesExhausted as exc:
        verdict = exc.reason
    finally:
        if keeper is not None:
            keeper.cancel()
    return verdict, clock.now()


@pytest.mark.parametrize(
    ("pause_s", "progress_every_s", "expected"),
    [
        pytest.param(200, None, "success", id="local-fresh-scope-stale"),
        pytest.param(200, 100, "success", id="local-fresh-scope-fresh"),
        pytest.param(1000, 100, "success", id="local-exceeded-scope-fresh"),
        pytest.param(1000, None, "stalled", id="local-exceeded-scope-stale"),
    ],
)
async def test_four_quadrants_only_both_exceeded_is_stalled(
    clock: VirtualClock,
    gateway: GatewayFactory,
    store: Store,
    pause_s: float,
    progress_every_s: float | None,
    expected: str,
) -> None:
    verdict, ended = await run_paused_call(
        clock, gateway, store, pause_s=pause_s, progress_every_s=progress_every_s
    )
    assert verdict == expected
    if expected == "stalled":
        assert WINDOW < ended <= WINDOW + 1.0  # at most one poll interval late
    else:
        assert pause_s <= ended <= pause_s + 1.0


async def test_progress_going_stale_later_stalls_within_one_poll(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    """The last success anywhere was at t=500: the verdict comes once that is 300 s old."""
    gw = gateway(
        make_config("chat", max_call_s=10_000),
        {"a": ScriptedSource.always(clock, steps.ok())},
        store=store,
    )
    await store.pause_source("a", 5_000)

    async def successes_until_500() -> None:
        for _ in range(5):
            await store.mark_progress("s")
            await clock.sleep(100)
        await store.mark_progress("s")

    other = asyncio.ensure_future(successes_until_500())
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")
    await other
    assert caught.value.reason == "stalled"
    assert 800.0 < clock.now() <= 801.0


@pytest.mark.parametrize("kind", ["chat", "embedding", "ocr"])
async def test_productive_time_never_stalls_however_long(
    kind: str, clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Time charged to the retry budget. (With `outage_is_waiting`, the default, the
    second timeout of a lone call is the outage's: `test_outage_is_waiting`.)"""
    source = ScriptedSource(clock, [steps.timeout(), steps.timeout(), steps.ok("late")])
    config = make_config(
        kind, {"a": {"timeout_s": 10_000}}, stall_window_s=5, outage_is_waiting=False
    )
    gw = gateway(config, {"a": source})

    result = await gw.call("s", "x")

    assert result.value == "late"
    assert clock.now() == 20_000 + 1 + 2  # two timeouts, backoffs of 1 s and 2 s
    assert source.attempts == 3


async def test_non_productive_waiting_alone_stalls(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    verdict, ended = await run_paused_call(
        clock, gateway, store, pause_s=10_000, progress_every_s=None
    )
    assert (verdict, WINDOW < ended <= WINDOW + 1) == ("stalled", True)


async def test_chat_429_saturation_backs_off_on_its_streak_and_stalls(
    clock: VirtualClock, gateway: GatewayFactory, recorder: Recorder
) -> None:
    """SPEC §3 rule 3: 429s without a hint grow the delay on the streak's own counter."""
    source = ScriptedSource.always(clock, steps.rate_limited(duration_s=0.5))
    config = make_config(
        "chat", stall_window_s=30, backoff_base_s=2, backoff_max_s=8, max_attempts=3
    )
    gw = gateway(config, {"a": source})

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")

    assert caught.value.reason == "stalled"
    backoffs = [e.seconds for e in recorder.of(WaitEvent) if e.cause == "backoff"]
    assert len(backoffs) > 3  # more 429s than max_attempts: none burned the budget
    # backoff_delay(streak) with the random source at 0, capped at backoff_max_s
    assert backoffs == [1.0, 2.0, 4.0] + [4.0] * (len(backoffs) - 3)
    assert source.attempts == len(backoffs)  # each 429 is followed by one backoff


async def test_another_outcome_resets_the_rate_limited_streak(
    clock: VirtualClock, gateway: GatewayFactory, recorder: Recorder
) -> None:
    script = [steps.rate_limited()] * 3 + [steps.server_error()] + [steps.rate_limited()] * 2
    source = ScriptedSource(clock, iter([*script, steps.ok()]))
    config = make_config("chat", backoff_base_s=2, backoff_max_s=60, max_attempts=5)
    gw = gateway(config, {"a": source})
    await gw.call("s", "x")
    backoffs = [e.seconds for e in recorder.of(WaitEvent) if e.cause == "backoff"]
    # three 429s (1, 2, 4), a 500 (the call's first failure: 1), then the streak anew
    assert backoffs == [1.0, 2.0, 4.0, 1.0, 1.0, 2.0]


async def test_two_concurrent_calls_keep_separate_clocks(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Call A holds the only permit for 500 productive seconds; B, waiting, stalls at ~300."""
    source = ScriptedSource(clock, itertools.repeat(steps.ok("a", duration_s=500)))
    config = make_config("chat", {"a": {"max_concurrency": 1, "timeout_s": 600}})
    gw = gateway(config, {"a": source})

    first = asyncio.ensure_future(gw.call("s", "A"))
    await until(lambda: source.attempts == 1)  # A holds the permit first
    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "B")
    b_ended = clock.now()
    result = await first

    assert caught.value.reason == "stalled"
    assert 300.0 < b_ended <= 301.0
    assert result.value == "a"
    assert result.elapsed_s == 500.0


async def test_raising_telemetry_hook_changes_no_verdict(
    clock: VirtualClock, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("metrics backend down")

    source = ScriptedSource.always(clock, steps.rate_limited(duration_s=300))
    config = make_config("chat", {"gw": {"timeout_s": 300}}, stall_window_s=300)
    gw = gateway(config, {"gw": source}, hooks=[broken])

    with pytest.raises(AllSourcesExhausted) as caught:
        await gw.call("s", "x")

    assert (caught.value.reason, source.attempts, clock.now()) == ("stalled", 1, 301.0)
    assert "telemetry hook" in caplog.text

    ok_gw = gateway(
        make_config("chat"), {"a": ScriptedSource.always(clock, steps.ok("y"))}, hooks=[broken]
    )
    assert (await ok_gw.call("s", "x")).value == "y"
