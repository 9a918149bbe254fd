"""The engine's attempts, driven directly: what an attempt settles and records, which
budget it burns, the verdict or the backoff after it (SPEC §3 rules 1, 3, 4, 15-17).

As in test_engine_rules.py, each test answers the engine's actions itself and
passes `now` as a plain number.
"""

from __future__ import annotations

import math

import pytest

from polygate_celery.core.backoff import backoff_ceiling
from polygate_celery.core.engine import (
    Admit,
    AskProgress,
    Begin,
    CallState,
    Done,
    Event,
    GiveUp,
    Granted,
    ProgressAge,
    Record,
    Refused,
    Send,
    Sent,
    Settle,
    Settled,
    Wait,
    Waited,
    next_action,
    start,
)
from polygate_celery.core.engine.actions import Action
from polygate_celery.core.outcome import Outcome
from polygate_celery.core.selection import BlockReason
from tests.unit.core.test_engine_rules import make_rules

HTTP_503 = Outcome.transient("HTTP 503", status=503)
BREAKERS_OPEN: tuple[tuple[str, BlockReason], ...] = (("a", "breaker_open"), ("b", "breaker_open"))


def steps(state: CallState, *script: tuple[Event, float]) -> tuple[CallState, Action]:
    """Answer the engine with each (event, now) in turn; the last state and action."""
    action: Action | None = None
    for event, now in script:
        state, action = next_action(state, event, now)
    assert action is not None
    return state, action


def attempt(
    state: CallState, source: str, outcome: Outcome, at: float, took: float
) -> tuple[CallState, Record]:
    """From an `Admit`: grant `source` at `at`, send, settle; the `Record` (an outage's
    progress age, if asked for, says the scope served nobody)."""
    state, action = steps(state, (Granted(source), at), (Sent(outcome), at + took))
    assert isinstance(action, Settle)
    state, action = next_action(state, Settled(), at + took)
    if isinstance(action, AskProgress):
        state, action = next_action(state, ProgressAge(math.inf), at + took)
    assert isinstance(action, Record)
    return state, action


def test_the_backoff_ceiling_stops_growing_at_its_exponent_cap() -> None:
    """The exponent is capped at 64 before it is computed (2**n overflows a float
    past ~1024): past the 65th failure the ceiling is that of the 65th."""
    assert backoff_ceiling(65, 1.0, math.inf) == 2.0**64
    assert backoff_ceiling(66, 1.0, math.inf) == 2.0**64
    assert backoff_ceiling(10**6, 1.0, math.inf) == 2.0**64


def test_a_success_settles_without_an_error_and_is_recorded_as_it_came() -> None:
    """A success burns no budget, tells the store no error, leaves the call's latest
    failure where it was, and its trail line carries its outcome (for telemetry)."""
    rules = make_rules(outage_charge="retry_budget")
    state, _ = next_action(start(rules, 0.0), Begin(), 0.0)
    state, _ = attempt(state, "a", HTTP_503, 0.0, 4.0)
    assert state.failed_at == 4.0
    state, _ = steps(state, (Done(), 4.0), (Waited(), 6.0))
    ok = Outcome.success("ok")
    state, settle = steps(state, (Granted("a"), 6.0), (Sent(ok), 10.0))
    assert isinstance(settle, Settle)
    assert settle.error is None
    state, record = next_action(state, Settled(), 10.0)
    assert isinstance(record, Record)
    assert record.outcome is ok
    assert record.record.burned_budget is False
    assert record.record.productive is True
    assert state.failed_at == 4.0  # the latest failure, not the success
    assert state.productive_s == 8.0


@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize(
    ("exempt", "charge", "outcome"),
    [
        (False, "retry_budget", HTTP_503),  # charged to the retry budget
        (False, "waiting", Outcome.rate_limited()),  # a charged 429
        (True, "waiting", Outcome.rate_limited()),  # an exempt 429, charged to waiting
    ],
)
def test_a_backoff_that_is_not_an_outages_is_cut_only_by_the_deadline(
    gate: bool, exempt: bool, charge: str, outcome: Outcome
) -> None:
    """Only an outage's backoff under a scope gate ends a poll past the stall budget
    (rule 16); any other backoff is cut to the call's deadline alone."""
    rules = make_rules(
        scope_gate=gate,
        rate_limit_exempt=exempt,
        outage_charge=charge,
        stall_window_s=10.0,
        max_call_s=500.0,
        backoff_base_s=1_000.0,
        backoff_max_s=1_000.0,
    )
    state, _ = next_action(start(rules, 100.0), Begin(), 100.0)
    state, _ = attempt(state, "a", outcome, 100.0, 4.0)
    _, action = next_action(state, Done(), 104.0)
    assert action == Wait("backoff", 1_000.0, True, 496.0)


def test_a_charged_429_backs_off_on_the_calls_failures_not_on_a_streak() -> None:
    """A 429 that burns the retry budget grows the backoff on the call's failures
    (rule 4), like any other charged failure; only an exempt 429 counts a streak."""
    rules = make_rules(rate_limit_exempt=False, outage_charge="retry_budget", max_attempts=5)
    state, _ = next_action(start(rules, 0.0), Begin(), 0.0)
    state, _ = attempt(state, "a", HTTP_503, 0.0, 1.0)
    state, action = next_action(state, Done(), 1.0)
    assert action == Wait("backoff", 2.0, True, 9_999.0)
    state, _ = next_action(state, Waited(), 3.0)
    state, _ = attempt(state, "a", Outcome.rate_limited(), 3.0, 1.0)
    state, action = next_action(state, Done(), 4.0)
    assert action == Wait("backoff", 4.0, True, 9_996.0)
    assert (state.fails, state.rate_limited_streak) == (2, 0)


def test_an_outages_backoff_under_a_gate_ends_one_poll_past_the_stall_budget() -> None:
    """Under a scope gate, an outage's backoff is cut to the stall budget left plus one
    poll (rule 16): the budget's rest and a poll while some is left, a poll exactly
    once it is spent."""
    rules = make_rules(
        scope_gate=True, rate_limit_exempt=False, outage_charge="waiting", stall_window_s=10.0
    )
    state, _ = next_action(start(rules, 0.0), Begin(), 0.0)
    state, record = attempt(state, "a", HTTP_503, 0.0, 1.0)
    assert record.record.productive  # the call's first (rule 5)
    state, action = next_action(state, Done(), 1.0)
    assert action == Wait("backoff", 2.0, True, 10.0 + 1.0)
    state, action = next_action(state, Waited(), 3.0)  # 2 s of stall time: no check
    assert isinstance(action, Admit)
    state, record = attempt(state, "a", HTTP_503, 3.0, 27.0)
    assert not record.record.productive
    state, action = next_action(state, Done(), 30.0)  # 29 s of stall time
    assert action == Wait("backoff", 4.0, True, 1.0)


def test_a_charged_failures_backoff_goes_on_to_the_next_round_without_a_stall_check() -> None:
    """Where 429s are not exempt, the stall is checked after a backoff only when the
    failure was charged to waiting (rule 15): a charged one goes on to ask for a permit,
    however long the call has waited before."""
    rules = make_rules(rate_limit_exempt=False, outage_charge="retry_budget", stall_window_s=10.0)
    state, action = steps(
        start(rules, 0.0), (Begin(), 0.0), (Refused(None, BREAKERS_OPEN), 0.0), (Waited(), 50.0)
    )
    assert isinstance(action, Admit)
    state, record = attempt(state, "a", HTTP_503, 50.0, 1.0)
    assert record.record.burned_budget
    state, action = steps(state, (Done(), 51.0), (Waited(), 53.0))
    assert state.stalled_s(53.0) > rules.stall_window_s
    assert isinstance(action, Admit)


def test_a_call_that_met_its_own_error_keeps_it_over_the_fleets() -> None:
    """A refusal names the fleet's evidence only while the call met no error of its own:
    the call's own failure replaces the fleet's, and a later refusal leaves it."""
    rules = make_rules(outage_charge="retry_budget")
    fleet = Refused(None, BREAKERS_OPEN, errors=(("a", "transient: connection refused"),))
    state, _ = steps(start(rules, 0.0), (Begin(), 0.0), (fleet, 0.0))
    assert (state.last_error, state.fleet_error) == ("a: transient: connection refused", True)
    state, action = next_action(state, Waited(), 1.0)
    assert isinstance(action, Admit)
    state, _ = attempt(state, "b", HTTP_503, 1.0, 1.0)
    state, _ = steps(state, (Done(), 2.0), (Waited(), 4.0))
    own = "b: transient (HTTP 503): HTTP 503"
    assert (state.last_error, state.fleet_error) == (own, False)
    state, action = next_action(state, fleet, 4.0)
    assert isinstance(action, Wait)
    assert state.last_error == own


def test_an_attempt_that_meets_the_deadline_gives_up_with_the_known_reopening() -> None:
    """An attempt that ends at the call's deadline gives up `deadline`, with the
    reopening a refusal told of as the verdict's hint (rule 7)."""
    rules = make_rules(outage_charge="retry_budget", max_call_s=30.0)
    paused = Refused(100.0, (("a", "paused"), ("b", "paused")))
    state, action = steps(start(rules, 0.0), (Begin(), 0.0), (paused, 0.0), (Waited(), 1.0))
    assert isinstance(action, Admit)
    state, action = next_action(state, Granted("a"), 1.0)
    assert isinstance(action, Send)
    assert action.timeout_s == 29.0
    state, _ = attempt_from_send(state, Outcome.timeout(), 30.0)
    _, verdict = next_action(state, Done(), 30.0)
    assert verdict == GiveUp("deadline", 70.0, True)


def attempt_from_send(state: CallState, outcome: Outcome, now: float) -> tuple[CallState, Action]:
    state, action = steps(state, (Sent(outcome), now), (Settled(), now))
    assert isinstance(action, Record)
    return state, action
