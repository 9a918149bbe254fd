"""`ScriptedSource` (SPEC §5 rule 5, §7): scripted attempts on the virtual clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polygate_celery.core.outcome import Outcome, OutcomeKind
from polygate_celery.testing import ScriptedSource, ScriptExhausted, VirtualClock, steps

EXPECTED: list[tuple[steps.Step, dict[str, Any]]] = [
    (steps.ok("hi", tokens=7), {"kind": OutcomeKind.SUCCESS, "value": "hi", "status": 200}),
    (
        steps.rate_limited(retry_after_s=12.0),
        {"kind": OutcomeKind.RATE_LIMITED, "status": 429, "retry_after_s": 12.0},
    ),
    (steps.rate_limited(), {"kind": OutcomeKind.RATE_LIMITED, "status": 429}),
    (steps.server_error(), {"kind": OutcomeKind.TRANSIENT, "status": 500}),
    (steps.server_error(status=503), {"kind": OutcomeKind.TRANSIENT, "status": 503}),
    (
        steps.fatal("content policy"),
        {"kind": OutcomeKind.FATAL, "status": 400, "reason": "content policy"},
    ),
    (steps.source_rejected(), {"kind": OutcomeKind.REJECTED, "status": 400}),
    (
        steps.auth_rejected(),
        {"kind": OutcomeKind.REJECTED, "status": 401, "credentials_rejected": True},
    ),
    (
        steps.auth_rejected(status=403),
        {"kind": OutcomeKind.REJECTED, "status": 403, "credentials_rejected": True},
    ),
]
DEFAULTS: dict[str, Any] = {
    "retry_after_s": None,
    "credentials_rejected": False,
    "timed_out": False,
}


@pytest.mark.parametrize(
    ("step", "expected"), EXPECTED, ids=[f"{s.kind}-{s.status}" for s, _ in EXPECTED]
)
async def test_each_step_kind_maps_to_its_outcome(
    clock: VirtualClock, step: steps.Step, expected: dict[str, Any]
) -> None:
    source = ScriptedSource(clock, [step])
    outcome = await source.send("payload", timeout_s=30)
    assert isinstance(outcome, Outcome)
    for name, value in {**DEFAULTS, **expected}.items():
        assert getattr(outcome, name) == value, name


async def test_an_ok_step_reports_its_tokens(clock: VirtualClock) -> None:
    outcome = await ScriptedSource(clock, [steps.ok(tokens=42)]).send(None, timeout_s=1)
    assert outcome.used_tokens == 42
    outcome = await ScriptedSource(clock, [steps.ok()]).send(None, timeout_s=1)
    assert outcome.used_tokens is None


async def test_a_step_takes_its_duration_on_the_clock(clock: VirtualClock) -> None:
    source = ScriptedSource(clock, [steps.ok(duration_s=4.5), steps.server_error(duration_s=2)])
    await source.send(None, timeout_s=30)
    assert clock.now() == 4.5
    outcome = await source.send(None, timeout_s=30)
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert clock.now() == 6.5


@pytest.mark.parametrize(
    "step",
    [
        steps.ok(duration_s=31),
        steps.rate_limited(duration_s=30.001, retry_after_s=5),
        steps.server_error(duration_s=100),
        steps.fatal(duration_s=31),
        steps.auth_rejected(duration_s=31),
    ],
    ids=lambda s: s.kind,
)
async def test_a_step_longer_than_the_timeout_ends_at_the_timeout(
    clock: VirtualClock, step: steps.Step
) -> None:
    outcome = await ScriptedSource(clock, [step]).send(None, timeout_s=30)
    assert clock.now() == 30.0
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert outcome.timed_out is True
    assert outcome.status is None
    assert outcome.retry_after_s is None


async def test_a_429_at_exactly_the_deadline_is_a_429(clock: VirtualClock) -> None:
    step = steps.rate_limited(duration_s=300, retry_after_s=60)
    outcome = await ScriptedSource(clock, [step]).send(None, timeout_s=300)
    assert clock.now() == 300.0
    assert outcome.kind is OutcomeKind.RATE_LIMITED
    assert (outcome.status, outcome.retry_after_s, outcome.timed_out) == (429, 60, False)


async def test_a_success_at_exactly_the_deadline_is_a_success(clock: VirtualClock) -> None:
    outcome = await ScriptedSource(clock, [steps.ok("done", duration_s=5)]).send(None, timeout_s=5)
    assert (outcome.kind, outcome.value, outcome.timed_out) == (OutcomeKind.SUCCESS, "done", False)


async def test_timeout_holds_for_the_granted_timeout(clock: VirtualClock) -> None:
    source = ScriptedSource(clock, [steps.timeout(), steps.timeout()])
    outcome = await source.send(None, timeout_s=300)
    assert clock.now() == 300.0
    assert (outcome.kind, outcome.timed_out) == (OutcomeKind.TRANSIENT, True)
    await source.send(None, timeout_s=7.5)
    assert clock.now() == 307.5


async def test_always_repeats_its_step(clock: VirtualClock) -> None:
    source = ScriptedSource.always(clock, steps.rate_limited(duration_s=1))
    outcomes = [await source.send(i, timeout_s=10) for i in range(25)]
    assert {o.kind for o in outcomes} == {OutcomeKind.RATE_LIMITED}
    assert source.attempts == 25
    assert clock.now() == 25.0


async def test_an_exhausted_script_raises(clock: VirtualClock) -> None:
    source = ScriptedSource(clock, [steps.ok()])
    await source.send(None, timeout_s=1)
    with pytest.raises(ScriptExhausted, match="1 attempt"):
        await source.send(None, timeout_s=1)
    with pytest.raises(ScriptExhausted):
        await source.send(None, timeout_s=1)
    assert source.attempts == 1  # a refused request is not journalled
    with pytest.raises(ScriptExhausted):
        await ScriptedSource(clock, []).send(None, timeout_s=1)


async def test_a_generator_script_is_played_lazily(clock: VirtualClock) -> None:
    def script() -> Any:
        yield steps.server_error()
        yield steps.ok("second")

    source = ScriptedSource(clock, script())
    assert (await source.send(None, timeout_s=1)).kind is OutcomeKind.TRANSIENT
    assert (await source.send(None, timeout_s=1)).value == "second"


async def test_the_journal_records_each_request(clock: VirtualClock) -> None:
    script = [steps.server_error(duration_s=3), steps.timeout(), steps.ok("v", duration_s=1)]
    source = ScriptedSource(clock, script)
    clock.advance(100)
    outcomes = [
        await source.send({"n": 1}, timeout_s=10),
        await source.send({"n": 2}, timeout_s=20),
        await source.send({"n": 3}, timeout_s=30),
    ]
    journal = source.journal
    assert [s.at for s in journal] == [100.0, 103.0, 123.0]
    assert [s.payload for s in journal] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [s.timeout_s for s in journal] == [10, 20, 30]
    assert [s.step for s in journal] == script
    assert [s.outcome for s in journal] == outcomes
    assert journal[1].outcome is not None
    assert journal[1].outcome.timed_out


async def test_a_cancelled_request_is_journalled_without_an_outcome(clock: VirtualClock) -> None:
    source = ScriptedSource(clock, [steps.ok(duration_s=50)])
    task = asyncio.create_task(source.send("p", timeout_s=60))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert source.attempts == 1
    assert source.journal[0].outcome is None
    assert clock.now() == 0.0


async def test_concurrent_requests_interleave_on_the_clock(clock: VirtualClock) -> None:
    slow = ScriptedSource(clock, [steps.ok("slow", duration_s=10)])
    fast = ScriptedSource(clock, [steps.ok("fast", duration_s=3)])
    done: list[tuple[str, float]] = []

    async def call(source: ScriptedSource) -> None:
        outcome = await source.send(None, timeout_s=60)
        done.append((outcome.value, clock.now()))

    await asyncio.gather(call(slow), call(fast))
    assert done == [("fast", 3.0), ("slow", 10.0)]


async def test_a_first_token_limit_cuts_a_later_first_token(clock: VirtualClock) -> None:
    script = [steps.streamed("late", first_token_s=20, duration_s=25), steps.stuck_first_token()]
    source = ScriptedSource(clock, script, ttft_timeout_s=15)
    assert source.limits_first_token("payload")
    cut = await source.send(None, timeout_s=60)
    assert clock.now() == 15.0
    assert (cut.kind, cut.timed_out, cut.first_token_cut) == (OutcomeKind.TRANSIENT, True, True)
    await source.send(None, timeout_s=60)
    assert clock.now() == 30.0
    assert [s.ttft_s for s in source.journal] == [15, 15]


async def test_a_lifted_first_token_limit_leaves_timeout_s_alone(clock: VirtualClock) -> None:
    script = [steps.streamed("late", first_token_s=20, duration_s=25), steps.stuck_first_token()]
    source = ScriptedSource(clock, script, ttft_timeout_s=15)
    answer = await source.send(None, timeout_s=60, first_token_limit=False)
    assert (answer.value, clock.now()) == ("late", 25.0)
    stuck = await source.send(None, timeout_s=60, first_token_limit=False)
    assert (stuck.timed_out, stuck.first_token_cut, clock.now()) == (True, False, 85.0)
    assert [s.ttft_s for s in source.journal] == [None, None]


async def test_a_first_token_in_time_or_a_limit_past_the_deadline_is_no_cut(
    clock: VirtualClock,
) -> None:
    source = ScriptedSource(
        clock, [steps.streamed("on time", first_token_s=15), steps.timeout()], ttft_timeout_s=15
    )
    assert (await source.send(None, timeout_s=60)).value == "on time"
    outcome = await source.send(None, timeout_s=10)  # the deadline comes first
    assert (outcome.first_token_cut, clock.now()) == (False, 25.0)
    assert not ScriptedSource(clock, []).limits_first_token("payload")
