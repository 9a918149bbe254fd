"""The engine's rounds, driven directly: the ask for a permit, the order of the sources
asked, what a refusal teaches the call and the wait after it (SPEC §3, §5).

As in test_engine_rules.py, no store and no clock: each test answers the engine's
actions itself and passes `now` as a plain number. The actions are compared whole,
so every field a driver reads (a wait's cause, jitter and cap; an ask's queue and
booking flags) is pinned.
"""

from __future__ import annotations

import pytest

from polygate_celery.core.engine import (
    Admit,
    AskProgress,
    Begin,
    CallRules,
    CallState,
    Done,
    GiveUp,
    Granted,
    ProgressAge,
    Record,
    Refused,
    Send,
    Sent,
    Settle,
    Settled,
    Step,
    Wait,
    Waited,
    next_action,
    replace,
    start,
)
from polygate_celery.core.outcome import Outcome
from tests.unit.core import test_engine_rules as rule_tests

BREAKERS_OPEN = (("a", "breaker_open"), ("b", "breaker_open"))
AT_CAPACITY = (("a", "at_capacity"), ("b", "at_capacity"))


def make_rules(**overrides: object) -> CallRules:
    """The rules' tests' call, with a direct caller's charging: 429s and outages burn
    the retry budget, five attempts."""
    defaults: dict[str, object] = {
        "rate_limit_exempt": False,
        "max_attempts": 5,
        "outage_charge": "retry_budget",
    }
    return rule_tests.make_rules(**(defaults | overrides))


def fail_and_back_off(state: CallState, source: str, outcome: Outcome, now: float) -> Step:
    """A grant at `source` whose attempt ends at `now` with `outcome` (charged to the
    retry budget, or an exempt 429): the steps up to the backoff after it."""
    state, action = next_action(state, Granted(source), now)
    assert isinstance(action, Send)
    state, action = next_action(state, Sent(outcome), now)
    assert isinstance(action, Settle)
    state, action = next_action(state, Settled(), now)
    assert isinstance(action, Record)
    state, action = next_action(state, Done(), now)
    assert isinstance(action, Wait)
    assert action.cause == "backoff"
    return Step(state, action)


def test_a_round_asks_with_what_the_call_was_told_since_its_last_grant() -> None:
    """An ask says whether the call was refused since its last grant (it may be in a
    store's queue) and whether it was told it booked a quota's slot: both stick across
    refusals, and a grant clears both."""
    state, action = next_action(start(make_rules(), 0.0), Begin(), 0.0)
    assert action == Admit(("a", "b"), 3.0, False, False, 300.0)

    state, action = next_action(state, Refused(None, BREAKERS_OPEN), 0.0)
    assert action == Wait("no_runnable", 1.0, True, 10_000.0)
    state, action = next_action(state, Waited(), 1.0)
    assert action == Admit(("a", "b"), 3.0, True, False, 300.0)

    state, action = next_action(state, Refused(None, BREAKERS_OPEN, booked_in_s=50.0), 1.0)
    assert action == Wait("no_runnable", 50.0, False, 9_999.0)
    state, action = next_action(state, Waited(), 51.0)
    assert action == Admit(("a", "b"), 3.0, True, True, 300.0)

    state, action = next_action(state, Refused(None, BREAKERS_OPEN), 51.0)
    assert isinstance(action, Wait)
    state, action = next_action(state, Waited(), 52.0)
    assert action == Admit(("a", "b"), 3.0, True, True, 300.0)  # the booking is still held

    state, _ = fail_and_back_off(state, "a", Outcome.timeout(), 60.0)
    assert (state.refused, state.booked) == (False, False)
    state, action = next_action(state, Waited(), 62.0)
    assert action == Admit(("b", "a"), 3.0, False, False, 300.0)


@pytest.mark.parametrize(
    ("now", "book_within_s"), [(0.0, 30.0), (70.0, 30.0), (80.0, 20.0), (99.5, 0.5)]
)
def test_a_round_books_a_quota_slot_within_the_stall_window_and_the_deadline(
    now: float, book_within_s: float
) -> None:
    """A quota's slot may be booked no later than the stall window, nor past the
    call's deadline, however little of it is left."""
    rules = make_rules(stall_window_s=30.0, max_call_s=100.0)
    _, action = next_action(start(rules, 0.0), Begin(), now)
    assert action == Admit(("a", "b"), 3.0, False, False, book_within_s)


def test_a_round_asked_past_the_deadline_is_counted_and_gives_the_reopening() -> None:
    """A round begun at the deadline gives up at once, counted as begun, with the
    refusal's reopening (a rate limit's reset) as its hint."""
    state, _ = next_action(start(make_rules(max_call_s=100.0), 0.0), Begin(), 0.0)
    state, _ = next_action(state, Refused(20.0, (("a", "paused"), ("b", "quota"))), 90.0)
    state, verdict = next_action(state, Waited(), 100.0)
    assert verdict == GiveUp("deadline", 10.0, True)
    assert state.round == 2

    state, verdict = next_action(start(make_rules(max_call_s=100.0), 0.0), Begin(), 100.0)
    assert verdict == GiveUp("deadline", 300.0, False)
    assert state.round == 1


def test_each_round_is_counted_once_also_when_it_begins_with_a_stall_check() -> None:
    """An exempt call checks its stall at the top of each round: the round counts as
    begun from that check, and the ask that follows is the same round."""
    rules = make_rules(rate_limit_exempt=True, stall_window_s=10.0)
    state, action = next_action(start(rules, 0.0), Begin(), 20.0)
    assert isinstance(action, AskProgress)
    assert state.round == 1
    state, action = next_action(state, ProgressAge(5.0), 20.0)
    assert isinstance(action, Admit)
    assert state.round == 1
    state, _ = next_action(state, Refused(None, BREAKERS_OPEN), 20.0)
    state, action = next_action(state, ProgressAge(5.0), 20.0)
    assert isinstance(action, Wait)
    state, action = next_action(state, Waited(), 21.0)
    assert isinstance(action, AskProgress)
    state, action = next_action(state, ProgressAge(5.0), 21.0)
    assert isinstance(action, Admit)
    assert state.round == 2


def test_a_refusal_waits_a_poll_or_until_the_booked_slot_cut_to_the_deadline() -> None:
    """A refusal with no booking polls, jittered; one that booked a quota's slot waits
    until it, unjittered; either ends early on a release and is cut to the deadline."""
    rules = make_rules(max_call_s=100.0)
    asked, _ = next_action(start(rules, 0.0), Begin(), 40.0)
    state, action = next_action(asked, Refused(None, BREAKERS_OPEN), 40.0)
    assert action == Wait("no_runnable", 1.0, True, 60.0)
    assert state.phase == "poll"
    state, action = next_action(asked, Refused(None, BREAKERS_OPEN, booked_in_s=25.0), 40.0)
    assert action == Wait("no_runnable", 25.0, False, 60.0)
    assert state.phase == "poll"


def test_a_call_whose_booked_slot_moved_waits_on_for_the_new_one_without_asking() -> None:
    """Told while it waits that a call served before it took its booked slot and it was
    booked another (`Waited.moved_in_s`), it waits for that one as if it had asked, and
    asks there as a booker; a move told to a call holding no booking begins a round."""
    rules = make_rules(max_call_s=100.0, stall_window_s=60.0)
    asked, _ = next_action(start(rules, 0.0), Begin(), 10.0)
    booked, action = next_action(asked, Refused(None, BREAKERS_OPEN, booked_in_s=5.0), 10.0)
    assert action == Wait("no_runnable", 5.0, False, 90.0)
    state, action = next_action(booked, Waited(moved_in_s=7.5), 12.0)
    assert action == Wait("no_runnable", 7.5, False, 88.0)
    assert state.phase == "poll"
    assert state.round == 1  # no new round: it did not ask
    state, action = next_action(state, Waited(), 19.5)
    assert isinstance(action, Admit)
    assert action.booked
    assert state.round == 2
    polled, _ = next_action(asked, Refused(None, BREAKERS_OPEN), 10.0)
    _, action = next_action(polled, Waited(moved_in_s=7.5), 11.0)
    assert isinstance(action, Admit)


def test_a_move_told_past_the_stall_budget_checks_the_stall_verdict_first() -> None:
    """A move is an answer like a refusal: past the call's own stall budget the scope's
    progress is asked for, and a stalled scope ends the call (rule 2)."""
    rules = make_rules(max_call_s=100.0, stall_window_s=30.0)
    asked, _ = next_action(start(rules, 0.0), Begin(), 25.0)
    booked, _ = next_action(asked, Refused(None, BREAKERS_OPEN, booked_in_s=5.0), 25.0)
    state, action = next_action(booked, Waited(moved_in_s=7.5), 31.0)
    assert action == AskProgress(own_class=True)
    _, action = next_action(state, ProgressAge(31.0), 31.0)
    assert isinstance(action, GiveUp)
    assert action.reason == "stalled"
    _, action = next_action(state, ProgressAge(1.0), 31.0)
    assert action == Wait("no_runnable", 7.5, False, 69.0)


@pytest.mark.parametrize(
    ("claim_s", "blocked", "queued"),
    [
        (0.5, AT_CAPACITY, True),  # a claim of less than a second still queues
        (0.0, AT_CAPACITY, False),  # no claim: no queue to wait in
        (3.0, (("a", "at_capacity"),), False),  # queued at one candidate of two
        (3.0, (("a", "at_capacity"), ("b", "breaker_open")), False),
    ],
)
def test_a_call_waits_in_the_queues_only_when_every_candidate_queued_it(
    claim_s: float, blocked: tuple[tuple[str, str], ...], queued: bool
) -> None:
    rules = make_rules(claim_s=claim_s, max_call_s=100.0)
    state, _ = next_action(start(rules, 0.0), Begin(), 10.0)
    state, action = next_action(state, Refused(None, blocked), 10.0)  # type: ignore[arg-type]
    assert action == Wait("no_runnable", 1.0, True, 90.0, queued)
    assert state.phase == ("queued" if queued else "poll")


def test_a_short_retry_after_holds_the_first_source_until_one_poll_past_it() -> None:
    """After a short Retry-After of the first source, rounds ask that source alone until
    one poll past the hint; from then on, and after any grant, the usual order (the
    failed source last) is back and the hold is gone."""
    rules = make_rules(rate_limit_exempt=True, wait_out_retry_after_s=5.0)
    state, _ = next_action(start(rules, 0.0), Begin(), 0.0)
    backing_off, _ = fail_and_back_off(state, "a", Outcome.rate_limited(3.0), 1.0)
    assert backing_off.hold_on == ("a", 4.0)

    held, action = next_action(backing_off, Waited(), 4.5)
    assert isinstance(action, Admit)
    assert action.order == ("a",)
    state, action = next_action(backing_off, Waited(), 5.0)
    assert isinstance(action, Admit)
    assert (action.order, state.hold_on) == (("b", "a"), None)

    state, _ = fail_and_back_off(held, "a", Outcome.timeout(), 4.5)
    assert state.hold_on is None
    state, action = next_action(state, Waited(), 4.6)
    assert isinstance(action, Admit)
    assert action.order == ("b", "a")


def test_an_excluded_source_is_never_asked_and_the_one_to_stay_on_is_asked_first() -> None:
    """The order follows the state whatever led to it: a state excluding a source, or
    naming one to stay on, with no failure recorded yet, is ordered accordingly."""
    state = start(make_rules(sources=("a", "b", "c")), 0.0)
    _, action = next_action(replace(state, excluded=frozenset({"a"})), Begin(), 0.0)
    assert isinstance(action, Admit)
    assert action.order == ("b", "c")
    _, action = next_action(replace(state, stay_on="c"), Begin(), 0.0)
    assert isinstance(action, Admit)
    assert action.order == ("c", "a", "b")


def test_a_call_with_no_error_of_its_own_names_the_fleets_latest_evidence() -> None:
    """A refusal's breaker or pause error is the call's last error until the call meets
    one of its own; a later refusal's evidence replaces it, but not the call's own."""
    state, _ = next_action(start(make_rules(), 0.0), Begin(), 0.0)
    first = Refused(None, BREAKERS_OPEN, errors=(("a", "transient: connection refused"),))
    state, _ = next_action(state, first, 0.0)
    assert state.last_error == "a: transient: connection refused"
    state, _ = next_action(state, Waited(), 1.0)
    later = Refused(None, BREAKERS_OPEN, errors=(("b", "transient (HTTP 503)"),))
    state, _ = next_action(state, later, 1.0)
    assert state.last_error == "b: transient (HTTP 503)"

    state, _ = next_action(state, Waited(), 2.0)
    state, _ = fail_and_back_off(state, "a", Outcome.timeout(), 3.0)
    state, _ = next_action(state, Waited(), 5.0)
    state, _ = next_action(state, later, 5.0)
    assert state.last_error == "a: transient: timeout"


def test_a_copy_with_unknown_names_names_them_all() -> None:
    state = start(make_rules(), 0.0)
    with pytest.raises(TypeError, match=r"^CallState has no field bogus, rounds$"):
        replace(state, rounds=3, bogus=1)


def test_a_retry_after_of_zero_is_no_hint() -> None:
    """A Retry-After of 0 s says nothing of when the source reopens: the settle pauses
    nothing, and the next round does not hold on to the source."""
    rules = make_rules(rate_limit_exempt=True, wait_out_retry_after_s=5.0)
    asked, _ = next_action(start(rules, 0.0), Begin(), 0.0)
    state, _ = next_action(asked, Granted("a"), 0.0)
    _, action = next_action(state, Sent(Outcome.rate_limited(0.0)), 1.0)
    assert isinstance(action, Settle)
    assert action.pause_s is None
    state, _ = fail_and_back_off(asked, "a", Outcome.rate_limited(0.0), 1.0)
    assert state.hold_on is None
    _, action = next_action(state, Waited(), 1.5)
    assert isinstance(action, Admit)
    assert action.order == ("b", "a")
