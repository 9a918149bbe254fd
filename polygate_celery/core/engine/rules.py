"""Decision core: `next_action`, the governance loop's rules as one pure function (SPEC §3).

Each round asks for a permit; a refusal waits (polling, or in the candidates'
queues) and checks the stall verdict; a grant sends one attempt, settles it,
decides which budget it burns, records it and judges it: a verdict, or a backoff
and a new round. Where a rule needs the store (the scope's progress age, a
breaker's state) the engine asks for it as an action and resumes on the event,
so the store is asked exactly when the rule needs it and never otherwise.

Overshoot bound (SPEC §3 rule 13). Let t* be the first instant at which both
stall conditions hold while the call is in a non-productive step. Checkpoints
sit at the end of every non-productive step for exempt policies (top of the
round, and every poll); otherwise at every poll and after the backoff of a
failure charged to waiting, so the verdict arrives by the end of the step that
contains t*: a poll, at most ``poll_interval_s``; a backoff, at most
``backoff_max_s``; a refunded attempt and its backoff, at most the source's
``timeout_s`` plus ``backoff_max_s``. `tests/property` checks this bound.
"""

from __future__ import annotations

from collections.abc import Callable

from polygate_celery.core.engine import attempts, rounds
from polygate_celery.core.engine.actions import Event
from polygate_celery.core.engine.state import (
    CallRules,
    CallState,
    Phase,
    Step,
    initial_state,
    replace,
)


def start(rules: CallRules, now: float) -> CallState:
    """A call entering the loop at `now`; answer its first `next_action` with `Begin`."""
    return initial_state(rules, now)


def next_action(state: CallState, event: Event, now: float) -> Step:
    """The call's next state and action, given the event that ended its last action."""
    return _HANDLERS[state.phase](state, event, now)


def abandon_attempt(state: CallState, now: float) -> CallState:
    """The attempt in flight ended by an exception (a cancellation, a store failure while
    settling): its time stays productive, as plain arithmetic (rule 8)."""
    attempt = state.attempt
    if attempt is None or state.phase not in _IN_ATTEMPT:
        return state
    return replace(state, productive_s=state.productive_s + (now - attempt.started), attempt=None)


# Phases inside an attempt's productive span, before its time is counted.
_IN_ATTEMPT: frozenset[Phase] = frozenset({"send", "settle", "outage_progress", "outage_breaker"})

_HANDLERS: dict[Phase, Callable[[CallState, Event, float], Step]] = {
    "start": rounds.begin_round,
    "top_stall": rounds.after_top_stall,
    "admit": rounds.admitted,
    "denied_stall": rounds.after_denied_stall,
    "poll": rounds.after_poll,
    "queued": rounds.after_queue_wait,
    "queued_stall": rounds.after_queued_stall,
    "send": attempts.sent,
    "settle": attempts.settled,
    "outage_progress": attempts.outage_progress,
    "outage_breaker": attempts.outage_breaker,
    "record": attempts.recorded,
    "backoff": attempts.after_backoff,
    "backoff_stall": attempts.after_backoff_stall,
}
