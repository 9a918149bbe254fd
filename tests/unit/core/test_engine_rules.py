"""SPEC §3 rules 1-17 as properties of the decision engine, driven directly.

No store, no virtual clock: each test answers the engine's actions itself and
passes `now` as a plain number (a wait advances it by its delay with the jitter
draw fixed at 0, an attempt by its scripted duration). Rule 12 is a rule of the
configuration, not of a call, and is checked in tests/unit/config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polygate_celery.core.backoff import backoff_ceiling, jitter
from polygate_celery.core.engine import (
    Action,
    Admit,
    AskBreaker,
    AskProgress,
    Begin,
    BreakerState,
    CallRules,
    CallState,
    Done,
    Event,
    Fail,
    GiveUp,
    Granted,
    ProgressAge,
    Record,
    Refused,
    Return,
    Send,
    Sent,
    Settle,
    Settled,
    Wait,
    Waited,
    abandon_attempt,
    next_action,
    start,
)
from polygate_celery.core.engine import replace as engine_replace
from polygate_celery.core.outcome import Outcome, OutcomeKind

A = TypeVar("A")
fast = settings(derandomize=True, max_examples=40, deadline=None)


def make_rules(**overrides: object) -> CallRules:
    fields: dict[str, object] = {
        "sources": ("a", "b"),
        "timeouts": {"a": 30.0, "b": 30.0},
        "rate_limit_exempt": True,
        "max_attempts": 3,
        "stall_window_s": 300.0,
        "max_call_s": 10_000.0,
        "backoff_base_s": 2.0,
        "backoff_max_s": 60.0,
        "poll_interval_s": 1.0,
        "retry_after_cap_s": 3600.0,
        "claim_s": 3.0,
    }
    fields.update(overrides)
    return CallRules(**fields)  # type: ignore[arg-type]


@dataclass
class Run:
    """What one call did: each action with the `now` it was decided at, and its end."""

    steps: list[tuple[float, Action, CallState]] = field(default_factory=list)
    now: float = 0.0

    @property
    def verdict(self) -> Action:
        return self.steps[-1][1]

    @property
    def state(self) -> CallState:
        return self.steps[-1][2]

    def actions(self, kind: type[A]) -> list[A]:
        return [a for _, a, _ in self.steps if isinstance(a, kind)]


def drive(
    rules: CallRules,
    script: Sequence[tuple[Outcome, float]],
    *,
    age_s: float = math.inf,
    breaker: str = "closed",
    start_at: float = 0.0,
) -> Run:
    """Answer the engine until a verdict: each admission grants the next scripted
    (outcome, seconds) at the first source asked; once the script is spent, every
    admission is refused (both breakers open, a quota slot booked 50 s ahead)."""
    refusal = Refused(None, (("a", "breaker_open"), ("b", "breaker_open")), booked_in_s=50.0)
    run = Run(now=start_at)
    state, event = start(rules, start_at), Begin()
    pending = iter(script)
    current: tuple[Outcome, float] | None = None
    for _ in range(20_000):
        state, action = next_action(state, event, run.now)
        run.steps.append((run.now, action, state))
        if isinstance(action, Return | GiveUp | Fail):
            return run
        if isinstance(action, Admit):
            current = next(pending, None)
            event = refusal if current is None else Granted(action.order[0])
        elif isinstance(action, Send):
            assert current is not None
            run.now += min(current[1], action.timeout_s)
            event = Sent(current[0])
        else:
            event = answer(run, action, age_s, breaker)
    raise AssertionError("the call never ended")


def answer(run: Run, action: Action, age_s: float, breaker: str) -> Event:
    if isinstance(action, AskProgress):
        return ProgressAge(age_s)
    if isinstance(action, AskBreaker):
        return BreakerState(breaker)
    if isinstance(action, Wait):
        delay = action.seconds * jitter(0.0) if action.jittered else action.seconds
        run.now += max(min(delay, action.cap_s), 0.0)
        return Waited()
    if isinstance(action, Settle):
        return Settled()
    return Done()


outcomes = st.sampled_from(
    [
        Outcome.success("ok"),
        Outcome.rate_limited(),
        Outcome.rate_limited(3.0),
        Outcome.transient("HTTP 503", status=503),
        Outcome.transient("connection refused"),
        Outcome.timeout(),
        Outcome.rejected("bad model", status=404),
    ]
)
scripts = st.lists(st.tuples(outcomes, st.floats(0.0, 400.0)), max_size=12)
charges = st.sampled_from(["waiting", "waiting_if_breaker_open", "retry_budget"])
ages = st.one_of(st.just(math.inf), st.floats(0.0, 2_000.0))


@fast
@given(scripts, st.booleans(), charges, ages)
def test_rule_1_the_two_budgets_split_every_second(
    script: list[tuple[Outcome, float]], exempt: bool, charge: str, age: float
) -> None:
    """Time of attempts that burn the retry budget is productive, every other second is
    stall time: stalled_s = elapsed - productive, and productive is exactly the sum of
    the attempts kept productive (a charged attempt is never refunded)."""
    run = drive(make_rules(rate_limit_exempt=exempt, outage_charge=charge), script, age_s=age)
    state = run.state
    kept = sum(r.seconds for r in state.trail if r.productive)
    assert math.isclose(state.productive_s, kept, abs_tol=1e-6)
    assert math.isclose(state.stalled_s(run.now), run.now - state.productive_s, abs_tol=1e-9)
    assert all(r.productive for r in state.trail if r.burned_budget)


@fast
@given(st.floats(0.0, 1_000.0), ages, st.floats(1.0, 600.0))
def test_rule_2_stalled_needs_both_the_call_and_the_scope_past_the_window(
    stalled: float, age: float, window: float
) -> None:
    """The verdict needs both budgets exceeded; the progress age (inf: never) is asked
    only once this call's own stall budget is spent."""
    state, action = next_action(start(make_rules(stall_window_s=window), 0.0), Begin(), stalled)
    if stalled <= window:
        assert isinstance(action, Admit)
        return
    assert isinstance(action, AskProgress)
    _, verdict = next_action(state, ProgressAge(age), stalled)
    if age > window:
        assert isinstance(verdict, GiveUp)
        assert verdict.reason == "stalled"
    else:
        assert isinstance(verdict, Admit)


@fast
@given(st.integers(1, 12), st.booleans())
def test_rule_3_waiting_spends_only_the_stall_budget(n: int, exempt: bool) -> None:
    """An exempt 429 burns no attempt, is refunded to the stall budget and backs off on
    the rate-limited streak's own counter; where 429s are not exempt, they are failures."""
    rules = make_rules(rate_limit_exempt=exempt, max_attempts=3, stall_window_s=10_000.0)
    run = drive(rules, [(Outcome.rate_limited(), 1.0)] * n + [(Outcome.success("ok"), 1.0)])
    backoffs = [a.seconds for a in run.actions(Wait) if a.cause == "backoff"]
    if exempt:
        assert isinstance(run.verdict, Return)
        assert run.state.fails == 0
        assert all(not r.burned_budget and not r.productive for r in run.state.trail[:-1])
        assert backoffs == [backoff_ceiling(k, 2.0, 60.0) for k in range(1, n + 1)]
    else:
        assert run.state.fails == min(n, 3)
        if n >= 3:
            assert isinstance(run.verdict, GiveUp)
            assert run.verdict.reason == "retry_exhausted"


@fast
@given(st.integers(1, 3), st.floats(0.5, 10.0), st.floats(1.0, 600.0))
def test_rule_4_backoff_grows_on_the_failures(n: int, base: float, cap: float) -> None:
    """After the n-th failure the backoff is min(max, base * 2^(n-1)) times one jitter."""
    rules = make_rules(
        max_attempts=10, backoff_base_s=base, backoff_max_s=cap, outage_charge="retry_budget"
    )
    script = [(Outcome.transient("HTTP 500", status=500), 0.0)] * n + [(Outcome.success("ok"), 0.0)]
    waits = [a for a in drive(rules, script).actions(Wait) if a.cause == "backoff"]
    assert [w.seconds for w in waits] == [backoff_ceiling(k, base, cap) for k in range(1, n + 1)]
    assert all(w.jittered for w in waits)


@fast
@given(st.floats(1.0, 5_000.0), st.floats(61.0, 5_000.0), charges, ages)
def test_rule_5_a_single_timeout_never_stalls(
    timeout: float, window: float, charge: str, age: float
) -> None:
    """A timeout of any length burns one attempt and no stall time: the next attempt
    runs, whatever `timeout_s` and `stall_window_s` are (a window longer than the one
    backoff after it, which is stall time)."""
    rules = make_rules(
        timeouts={"a": timeout, "b": timeout}, stall_window_s=window, outage_charge=charge,
        max_call_s=timeout * 10 + 2 * window,
    )  # fmt: skip
    run = drive(rules, [(Outcome.timeout(), timeout), (Outcome.success("ok"), 1.0)], age_s=age)
    assert isinstance(run.verdict, Return)
    assert run.state.trail[0].productive


@fast
@given(st.floats(0.0, 5_000.0), ages)
def test_rule_6_fail_fast_never_waits_nor_stalls(now: float, age: float) -> None:
    rules = make_rules(fail_fast=True, rate_limit_exempt=False)
    state, action = next_action(start(rules, 0.0), Begin(), now)
    assert isinstance(action, Admit)
    assert (action.claim_s, action.book_within_s) == (0.0, 0.0)
    _, verdict = next_action(state, Refused(None, (("a", "at_capacity"),)), now)
    assert isinstance(verdict, GiveUp)
    assert verdict.reason == "fail_fast"


@fast
@given(st.one_of(st.none(), st.floats(-10.0, 10_000.0), st.just(math.inf)), st.floats(0.0, 100.0))
def test_rule_7_retry_after_is_the_soonest_reopening_clamped(
    reopen_in: float | None, now: float
) -> None:
    rules = make_rules(fail_fast=True, poll_interval_s=1.0, retry_after_cap_s=3600.0)
    state, _ = next_action(start(rules, 0.0), Begin(), now)
    _, verdict = next_action(state, Refused(reopen_in, (("a", "paused"),)), now)
    assert isinstance(verdict, GiveUp)
    usable = reopen_in is not None and math.isfinite(reopen_in) and reopen_in > 0
    expected = min(reopen_in, 3600.0) if usable else 300.0  # type: ignore[type-var]
    assert math.isclose(verdict.retry_after_s, min(max(expected, 1.0), 3600.0), abs_tol=1e-6)
    assert 1.0 <= verdict.retry_after_s <= 3600.0


@fast
@given(st.floats(0.0, 300.0), st.floats(0.0, 1_000.0))
def test_rule_8_an_abandoned_attempt_is_plain_arithmetic(started: float, took: float) -> None:
    """A cancellation inside an attempt keeps its time productive; outside one, nothing."""
    state, action = next_action(start(make_rules(), 0.0), Begin(), started)
    assert isinstance(action, Admit)
    assert abandon_attempt(state, started + took) == state
    state, action = next_action(state, Granted("a"), started)
    assert isinstance(action, Send)
    productive_s = abandon_attempt(state, started + took).productive_s
    assert productive_s == (started + took) - started


@fast
@given(scripts, charges)
def test_rule_9_nothing_is_sent_without_a_permit(
    script: list[tuple[Outcome, float]], charge: str
) -> None:
    """Every send follows a grant of its own source (the store's refusal, or its failure,
    never lets a request out)."""
    run = drive(make_rules(outage_charge=charge), script)
    for (_, before, _), (_, action, _) in zip(run.steps, run.steps[1:], strict=False):
        if isinstance(action, Send):
            assert isinstance(before, Admit)
            assert action.source == before.order[0]


@fast
@given(scripts)
def test_rule_10_telemetry_is_never_read_back(script: list[tuple[Outcome, float]]) -> None:
    """A trail line is a notification: what the driver answers to it changes nothing."""
    run = drive(make_rules(), script)
    for i, (now, action, state) in enumerate(run.steps):
        if isinstance(action, Record):
            assert next_action(state, Done(), now) == next_action(state, Settled(), now)
            assert run.steps[i + 1][1] == next_action(state, Waited(), now).action


@fast
@given(scripts, st.sampled_from([0.0, 1024.0, 65536.0]))
def test_rule_11_only_durations_of_the_local_clock_matter(
    script: list[tuple[Outcome, float]], offset: float
) -> None:
    """The engine reads instants only as differences: shifting the local clock changes
    no decision (the store's clock reaches it only as a progress age)."""
    here, there = drive(make_rules(), script), drive(make_rules(), script, start_at=offset)
    assert [type(a) for _, a, _ in here.steps] == [type(a) for _, a, _ in there.steps]
    assert [r.outcome for r in here.state.trail] == [r.outcome for r in there.state.trail]
    assert type(here.verdict) is type(there.verdict)


@fast
@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=40), st.floats(1.0, 300.0))
def test_rule_13_a_stalled_verdict_is_at_most_one_step_late(
    durations: list[float], window: float
) -> None:
    """Exempt 429s on a scope that never answered: the verdict comes by the end of the
    step in which the stall budget ran out (poll, or refunded attempt plus backoff)."""
    rules = make_rules(stall_window_s=window, max_call_s=1e9, timeouts={"a": 100.0, "b": 100.0})
    run = drive(rules, [(Outcome.rate_limited(), d) for d in durations])
    assert isinstance(run.verdict, GiveUp)
    assert run.verdict.reason == "stalled"
    assert run.state.stalled_s(run.now) - window <= max(1.0, 100.0 + 60.0)


@fast
@given(st.floats(0.0, 20_000.0), st.floats(0.0, 20_000.0))
def test_rule_14_a_paid_result_is_returned(took: float, max_call: float) -> None:
    """A success is settled and returned even past the deadline or the stall window."""
    rules = make_rules(max_call_s=max_call, timeouts={"a": 1e9, "b": 1e9})
    state, action = next_action(start(rules, 0.0), Begin(), 0.0)
    if isinstance(action, GiveUp):  # a zero deadline ends the call before it asks
        return
    state, action = next_action(state, Granted("a"), 0.0)
    state, action = next_action(state, Sent(Outcome.success("ok")), took)
    assert isinstance(action, Settle)
    state, action = next_action(state, Settled(), took)
    state, action = next_action(state, Done(), took)
    assert isinstance(action, Return)


@fast
@given(
    charges,
    st.floats(0.0, 1_000.0),
    st.floats(0.0, 30.0),
    st.sampled_from(["closed", "open", "half_open"]),
)
def test_rule_15_an_outage_is_waiting(charge: str, age: float, took: float, breaker: str) -> None:
    """A transient failure with no progress of the scope since the call began is charged
    to waiting (a direct caller: only while the breaker is open); with progress since,
    it is the request's own and burns the retry budget."""
    rules = make_rules(outage_charge=charge)
    run = drive(
        rules, [(Outcome.transient("HTTP 503", status=503), took)], age_s=age, breaker=breaker
    )
    first = run.state.trail[0]
    progressed = age < took
    waiting = charge == "waiting" or (charge == "waiting_if_breaker_open" and breaker != "closed")
    assert first.burned_budget == (charge == "retry_budget" or progressed or not waiting)
    assert first.productive  # the call's first failure stays productive (rule 5)
    asked_breaker = bool(run.actions(AskBreaker))
    assert asked_breaker == (charge == "waiting_if_breaker_open" and not progressed)


@fast
@given(st.floats(0.0, 400.0), st.floats(1.0, 300.0))
def test_rule_16_a_parking_call_backs_off_at_most_one_poll_past_its_budget(
    spent: float, window: float
) -> None:
    """Under a scope gate, an outage's backoff ends one poll past the stall budget at
    most; a gate closed by another call's verdict defers this one at once."""
    rules = make_rules(
        scope_gate=True, stall_window_s=window, backoff_base_s=1_000.0, backoff_max_s=1_000.0
    )
    run = drive(rules, [(Outcome.transient("HTTP 503", status=503), 1.0)] * 2)
    for now, action, state in run.steps:
        if isinstance(action, Wait) and action.cause == "backoff":
            assert action.cap_s <= max(0.0, window - state.stalled_s(now)) + 1.0 + 1e-9
    spent = min(spent, window)  # a call whose budget is spent checks the stall first
    state, _ = next_action(start(rules, 0.0), Begin(), spent)
    _, verdict = next_action(state, Refused(None, (), gated_for_s=30.0), spent)
    assert isinstance(verdict, GiveUp)
    assert verdict.reason == "stalled"


@fast
@given(st.floats(0.0, 30.0))
def test_rule_17_a_cut_first_token_fails_over_at_once(took: float) -> None:
    cut = Outcome.timeout("first token", first_token_cut=True)
    run = drive(make_rules(), [(cut, took), (Outcome.success("ok"), 1.0)])
    backoff = [a for a in run.actions(Wait) if a.cause == "backoff"]
    assert [w.cap_s for w in backoff] == [0.0]
    sends = run.actions(Send)
    assert [s.source for s in sends] == ["a", "b"]


def test_the_stall_budget_is_asked_for_only_once_it_is_exceeded() -> None:
    """At a stall time equal to the window the store is not asked (rule 2's `>`)."""
    _, action = next_action(start(make_rules(stall_window_s=300.0), 0.0), Begin(), 300.0)
    assert isinstance(action, Admit)


def test_the_engine_is_pure() -> None:
    state = start(make_rules(), 5.0)
    assert next_action(state, Begin(), 7.0) == next_action(state, Begin(), 7.0)
    assert replace(state) == state
    assert OutcomeKind.SUCCESS.value == "success"


def test_a_call_starts_from_the_states_defaults_and_copies_check_their_names() -> None:
    rules = make_rules()
    assert start(rules, 5.0) == CallState(rules=rules, entered_at=5.0)
    state = engine_replace(start(rules, 5.0), round=2)
    assert state == replace(CallState(rules=rules, entered_at=5.0), round=2)
    with pytest.raises(TypeError, match="no field rounds"):
        engine_replace(state, rounds=3)


def test_a_backoff_after_an_outage_checks_the_stall_and_goes_on_while_the_scope_progresses() -> (
    None
):
    """After the backoff of a failure charged to waiting, a spent stall budget asks for
    the progress age: a scope that served another call meanwhile is not stalled, and
    the next round begins; one that served nobody is (rules 2 and 15)."""
    rules = make_rules(rate_limit_exempt=False, outage_charge="waiting", stall_window_s=10.0)
    state, action = next_action(start(rules, 0.0), Begin(), 0.0)
    state, action = next_action(state, Granted("a"), 0.0)
    state, action = next_action(state, Sent(Outcome.transient("HTTP 503", status=503)), 20.0)
    state, action = next_action(state, Settled(), 20.0)
    assert isinstance(action, AskProgress)
    state, action = next_action(state, ProgressAge(math.inf), 20.0)
    assert isinstance(action, Record)
    assert not action.record.burned_budget
    state, action = next_action(state, Done(), 20.0)
    assert isinstance(action, Wait)
    assert action.cause == "backoff"
    backed_off, action = next_action(state, Waited(), 40.0)  # 20 s of stall time
    assert isinstance(action, AskProgress)

    state, action = next_action(backed_off, ProgressAge(5.0), 40.0)
    assert isinstance(action, Admit)
    assert (state.phase, state.round, state.asked_at) == ("admit", 2, 40.0)
    _, verdict = next_action(backed_off, ProgressAge(math.inf), 40.0)
    assert verdict == GiveUp("stalled", 10.0, False)


def test_a_queued_call_polls_its_stall_and_waits_on_while_the_scope_progresses() -> None:
    """A call queued at every candidate waits one jittered poll at a time, keeping its
    places; past its stall budget each poll asks for the progress age: progress of the
    scope keeps it queued, none gives it up, with the refusal's reopening as its hint."""
    rules = make_rules(stall_window_s=10.0, max_call_s=100.0)
    state, action = next_action(start(rules, 0.0), Begin(), 0.0)
    assert isinstance(action, Admit)
    refusal = Refused(30.0, (("a", "at_capacity"), ("b", "at_capacity")))
    state, action = next_action(state, refusal, 0.0)
    assert action == Wait("no_runnable", 1.0, True, 100.0, True)

    state, action = next_action(state, Waited(), 11.0)
    assert isinstance(action, AskProgress)
    state, action = next_action(state, ProgressAge(2.0), 11.0)
    assert action == Wait("no_runnable", 1.0, True, 89.0, True)
    assert state.phase == "queued"

    state, action = next_action(state, Waited(), 12.0)
    assert isinstance(action, AskProgress)
    _, verdict = next_action(state, ProgressAge(math.inf), 12.0)
    assert verdict == GiveUp("stalled", 30.0 - 12.0, False)


def test_an_abandoned_attempt_is_counted_once_and_only_while_it_runs() -> None:
    """Abandoning clears the attempt, so its time is not counted twice; once the attempt
    is recorded its time is counted already, and abandoning then changes nothing."""
    rules = make_rules(outage_charge="retry_budget")
    state, _ = next_action(start(rules, 0.0), Begin(), 0.0)
    sending, _ = next_action(state, Granted("a"), 2.0)
    abandoned = abandon_attempt(sending, 7.0)
    assert (abandoned.productive_s, abandoned.attempt) == (5.0, None)
    assert abandon_attempt(abandoned, 9.0) == abandoned

    state, _ = next_action(sending, Sent(Outcome.timeout()), 7.0)
    state, action = next_action(state, Settled(), 7.0)
    assert isinstance(action, Record)
    assert state.attempt is not None
    assert abandon_attempt(state, 9.0) == state  # recorded: 5 s productive already
    state, action = next_action(state, Done(), 7.0)
    assert isinstance(action, Wait)
    assert abandon_attempt(state, 9.0) == state  # backing off


def test_a_reopening_due_now_is_no_longer_known() -> None:
    """At the instant a refusal's reopening comes, the verdict's hint falls back to the
    stall window (rule 7: a reopening that has come tells nothing more)."""
    rules = make_rules(max_call_s=30.0)
    state, _ = next_action(start(rules, 0.0), Begin(), 0.0)
    refusal = Refused(30.0, (("a", "breaker_open"), ("b", "breaker_open")))
    state, action = next_action(state, refusal, 0.0)
    assert isinstance(action, Wait)
    assert state.reopening_known(29.0)
    assert not state.reopening_known(30.0)
    _, verdict = next_action(state, Waited(), 30.0)
    assert verdict == GiveUp("deadline", 300.0, False)
