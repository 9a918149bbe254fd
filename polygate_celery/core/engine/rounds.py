"""Decision core: the engine's rounds, an ask for a permit and the waits after a refusal.

A round asks for a permit at the scope's sources, best first; a refusal waits
(a poll, a booked quota slot, or in the candidates' queues) and checks the stall
verdict (rule 2), asking for the progress age only when this call's own stall
budget is spent. Every verdict that ends the call here is a `GiveUp`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from polygate_celery.core.engine.actions import (
    Admit,
    AskProgress,
    Event,
    GiveUp,
    Granted,
    ProgressAge,
    Refused,
    Send,
    Wait,
    Waited,
)
from polygate_celery.core.engine.state import (
    RATE_LIMIT_BLOCKS,
    Attempting,
    CallState,
    Phase,
    Step,
    replace,
)
from polygate_celery.core.selection import preference_order
from polygate_celery.core.stall import is_stalled

Reason = Literal["stalled", "retry_exhausted", "fail_fast", "deadline"]


def give_up(state: CallState, now: float, reason: Reason) -> Step:
    rate_limited = state.reopen_is_reset and state.reopening_known(now)
    # stalled while its tenant's caps alone refused it (since its last grant): not the scope
    refusal = state.refusal if state.refused else None
    capped = reason == "stalled" and refusal is not None and _capped_alone(refusal)
    return Step(state, GiveUp(reason, state.retry_after_s(now), rate_limited, capped))


def check_stall(state: CallState, now: float, phase: Phase) -> Step | None:
    """Ask for the progress age only when this call's own stall budget is spent."""
    stalled_s = state.stalled_s(now)
    if stalled_s <= state.rules.stall_window_s:
        return None
    state = replace(state, phase=phase, checked_stalled_s=stalled_s)
    return Step(state, AskProgress(own_class=True))


def stalled(state: CallState, event: Event) -> bool:
    """The stall verdict (rule 2) once the progress age asked for has come."""
    assert isinstance(event, ProgressAge)
    return is_stalled(state.checked_stalled_s, event.age_s, state.rules.stall_window_s)


def begin_round(state: CallState, event: Event, now: float) -> Step:
    begun = state.round + 1
    if state.rules.rate_limit_exempt:  # the main-loop check exists only where 429s wait
        state = replace(state, round=begun)
        step = check_stall(state, now, "top_stall")
        if step is not None:
            return step
    return _ask(state, now, begun)


def after_top_stall(state: CallState, event: Event, now: float) -> Step:
    if stalled(state, event):
        return give_up(state, now, "stalled")
    return _ask(state, now, state.round)


def _ask(state: CallState, now: float, round_: int) -> Step:
    """Ask for a permit in round `round_` (the new state counts it begun)."""
    if now >= state.deadline:
        return give_up(replace(state, round=round_), now, "deadline")
    state, order = _order(state, now)
    rules = state.rules
    book_within_s = (
        0.0 if rules.fail_fast else max(0.0, min(rules.stall_window_s, state.deadline - now))
    )
    state = replace(state, phase="admit", round=round_, asked_at=now, order=order)
    claim_s = 0.0 if rules.fail_fast else rules.claim_s
    return Step(state, Admit(order, claim_s, state.refused, state.booked, book_within_s))


def _order(state: CallState, now: float) -> tuple[CallState, tuple[str, ...]]:
    """The sources to ask for, best first (SPEC §5 "Failover discipline"): while a
    short Retry-After of the first source runs, that source alone (the wait goes
    through the no-runnable path); a source just failed by a 5xx or a connection
    error first, once; otherwise configuration order, failed sources last."""
    rules = state.rules
    if state.hold_on is not None:
        source, until = state.hold_on
        # Past the hint by one poll at most: the store's clock may end the pause a
        # little later than this call's.
        if now < until + rules.poll_interval_s:
            return state, (source,)
        state = replace(state, hold_on=None)
    if not state.excluded and not state.last_failure and state.stay_on is None:
        return state, rules.sources
    last_failure = dict(state.last_failure)
    order = preference_order(rules.sources, state.excluded, last_failure, state.stay_on)
    return state, tuple(order)


def admitted(state: CallState, event: Event, now: float) -> Step:
    if isinstance(event, Granted):
        full_timeout_s = state.rules.timeouts[event.source]
        timeout_s = min(full_timeout_s, state.deadline - now)
        attempt = Attempting(event.source, now, timeout_s, full_timeout_s)
        state = replace(
            state,
            phase="send",
            attempt=attempt,
            stay_on=None,
            hold_on=None,
            refused=False,
            booked=False,
        )
        return Step(state, Send(event.source, timeout_s, state.asked_at, state.excluded))
    assert isinstance(event, Refused)
    state = replace(state, refused=True, booked=state.booked or event.booked_in_s is not None)
    if event.errors and (state.last_error is None or state.fleet_error):
        # A call that met no error of its own names the fleet's evidence.
        source, error = event.errors[0]
        state = replace(state, last_error=f"{source}: {error}", fleet_error=True)
    if event.gated_for_s is not None:
        # The scope was judged stalled and another call is probing it: defer at once.
        state = replace(
            state,
            gated=True,
            last_error=state.last_error or event.gated_error,
            reopen_at=now + event.gated_for_s,
            reopen_is_reset=event.gated_reset,
        )
        return give_up(state, now, "stalled")
    reopen_in_s = state.sane_hint(event.reopen_in_s)
    state = replace(
        state,
        reopen_at=None if reopen_in_s is None else now + reopen_in_s,
        reopen_is_reset=reopen_in_s is not None
        and all(reason in RATE_LIMIT_BLOCKS for _, reason in event.blocked),
        refusal=event,
    )
    if state.rules.fail_fast:
        return give_up(state, now, "fail_fast")
    if _capped_alone(event) and state.stalled_s(now) > state.rules.stall_window_s:
        # Its tenant's own caps hold it back, whatever the scope's progress: stalled.
        return give_up(state, now, "stalled")
    step = check_stall(state, now, "denied_stall")
    return step if step is not None else _wait_after_refusal(state, now)


def after_denied_stall(state: CallState, event: Event, now: float) -> Step:
    if stalled(state, event):
        return give_up(state, now, "stalled")
    return _wait_after_refusal(state, now)


def _wait_after_refusal(state: CallState, now: float) -> Step:
    refusal = state.refusal
    assert refusal is not None
    rules = state.rules
    if _queued_everywhere(state, refusal):
        return _queue_wait(state, now)
    cap_s = state.deadline - now
    if refusal.booked_in_s is not None:  # a quota's slot is booked: ask again then
        wait = Wait("no_runnable", refusal.booked_in_s, False, cap_s)
    else:
        wait = Wait("no_runnable", rules.poll_interval_s, True, cap_s)
    return Step(replace(state, phase="poll"), wait)


def after_poll(state: CallState, event: Event, now: float) -> Step:
    """A new round; but a call whose booked quota slot was moved while it waited for it
    (`Waited.moved_in_s`) waits on for the new one as if it had asked and been told so,
    its stall verdict checked as after a refusal (rule 2)."""
    moved_in_s = event.moved_in_s if isinstance(event, Waited) else None
    refusal = state.refusal
    if moved_in_s is None or refusal is None or refusal.booked_in_s is None:
        return begin_round(state, event, now)
    moved = dataclasses.replace(refusal, booked_in_s=moved_in_s)
    state = replace(state, refusal=moved, reopen_at=now + moved_in_s)
    step = check_stall(state, now, "denied_stall")
    return step if step is not None else _wait_after_refusal(state, now)


def _capped_alone(refusal: Refused) -> bool:
    """Whether every candidate refused the call for its tenant's own caps (SPEC §8): the
    scope may progress while it waits, but not for it."""
    return bool(refusal.blocked) and all(reason == "tenant_cap" for _, reason in refusal.blocked)


def _queued_everywhere(state: CallState, refusal: Refused) -> bool:
    """Whether the refusal put this call in the queue of every candidate: each refused
    it for capacity alone."""
    return (
        state.rules.claim_s > 0
        and refusal.gated_for_s is None
        and refusal.booked_in_s is None
        and len(refusal.blocked) == len(state.order)
        and all(reason == "at_capacity" for _, reason in refusal.blocked)
    )


def _queue_wait(state: CallState, now: float) -> Step:
    """Wait in the queues until a release hands this call a permit or its place is lost:
    each poll checks only the stall verdict and the deadline, not the store's permits."""
    refusal = state.refusal
    assert refusal is not None
    cap_s = state.deadline - now
    wait = Wait("no_runnable", state.rules.poll_interval_s, True, cap_s, True)
    return Step(replace(state, phase="queued"), wait)


def after_queue_wait(state: CallState, event: Event, now: float) -> Step:
    assert isinstance(event, Waited)
    if event.woken or event.lost or now >= state.deadline:
        return begin_round(state, event, now)
    step = check_stall(state, now, "queued_stall")
    return step if step is not None else _queue_wait(state, now)


def after_queued_stall(state: CallState, event: Event, now: float) -> Step:
    return give_up(state, now, "stalled") if stalled(state, event) else _queue_wait(state, now)
