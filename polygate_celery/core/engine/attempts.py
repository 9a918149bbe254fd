"""Decision core: the engine's attempts, from send to the verdict or the backoff after it.

An attempt is sent, settled, charged to one budget (rules 1, 3 and 15: a
productive failure burns `max_attempts`; an exempt 429 and an outage's failure
are refunded to waiting), recorded, then judged: a verdict, or a backoff and a
new round. A cut first token fails over at once (rule 17).

An outage is waiting, not the request's failure (SPEC §3 rule 15). A
transient failure burns the retry budget when the scope made progress
since the call's previous failure (since it began, for its first): another
call was served meanwhile, so the failure is this request's own. Otherwise
nothing tells it from an outage of the scope's sources, and in a governed
task, which parks, it is charged to waiting (a direct caller, which cannot
park, charges it so only while the source's breaker is open; else it burns
the retry budget: `ScopePlan.outage_charge`). Charged to waiting,
`max_attempts` is not touched, its time is refunded to the stall budget
unless it is the call's first failure (a single failed attempt, timeout or
not, never makes a stall verdict, rule 5), and the stall verdict is checked
after its backoff. So an outage that outlasts the stall window
ends calls `stalled` (their tasks defer) however many are in flight, a call
already in flight when it begins being charged at most one more failure,
while the breaker keeps the outage's traffic to about one probe per
cooldown; a lone request that can never succeed defers until the deferral
budget ends it. The backoff grows on the call's failures of both kinds; an
exempt 429's grows on the rate-limited streak's own counter (rule 3).
"""

from __future__ import annotations

from polygate_celery.core.backoff import backoff_ceiling
from polygate_celery.core.breaker import Effect, effect_of
from polygate_celery.core.engine.actions import (
    AskBreaker,
    AskProgress,
    BreakerState,
    Event,
    Fail,
    ProgressAge,
    Record,
    Return,
    Sent,
    Settle,
    Wait,
)
from polygate_celery.core.engine.rounds import begin_round, check_stall, give_up, stalled
from polygate_celery.core.engine.state import (
    CallState,
    Step,
    error_text,
    replace,
    same_source_worth_retrying,
)
from polygate_celery.core.outcome import AttemptRecord, Outcome, OutcomeKind


def sent(state: CallState, event: Event, now: float) -> Step:
    assert isinstance(event, Sent)
    assert state.attempt is not None
    attempt = state.attempt
    outcome = event.outcome
    kind = outcome.kind
    # An attempt the call's deadline cut short says nothing about its source.
    cut_short = (
        outcome.timed_out
        and not outcome.first_token_cut
        and attempt.timeout_s < attempt.full_timeout_s
    )
    success = kind is OutcomeKind.SUCCESS
    effect = Effect.NEUTRAL if cut_short else effect_of(kind, outcome.credentials_rejected)
    if success:  # a success that reports no usage keeps its estimate
        used = outcome.used_tokens if outcome.used_tokens is not None else state.rules.est_tokens
    else:
        used = 0
    settle = Settle(
        outcome,
        effect,
        congested=not cut_short and (kind is OutcomeKind.RATE_LIMITED or outcome.timed_out),
        pause_s=state.sane_hint(outcome.retry_after_s)
        if kind is OutcomeKind.RATE_LIMITED
        else None,
        used_tokens=used,
        error=None if success else error_text(outcome),
    )
    state = replace(state, phase="settle", attempt=replace(attempt, outcome=outcome))
    return Step(state, settle)


def settled(state: CallState, event: Event, now: float) -> Step:
    """Which budget the attempt burns (rules 1, 3 and 15)."""
    outcome = _outcome(state)
    rules = state.rules
    if outcome.kind is OutcomeKind.SUCCESS:
        return _conclude(state, now, charged=False, down=False)
    if outcome.kind is OutcomeKind.RATE_LIMITED and rules.rate_limit_exempt:
        return _conclude(state, now, charged=False, down=False, refund=True)
    if outcome.kind is OutcomeKind.TRANSIENT and rules.outage_charge != "retry_budget":
        return Step(replace(state, phase="outage_progress"), AskProgress())
    return _conclude(state, now, charged=True, down=False)


def outage_progress(state: CallState, event: Event, now: float) -> Step:
    """An outage is waiting (rule 15): a failure with no progress of the scope since the
    call's previous failure (since it began, for its first) cannot be told from one.
    Progress age is a duration on the store's clock, compared with one on this call's."""
    assert isinstance(event, ProgressAge)
    assert state.attempt is not None
    since = state.failed_at if state.failed_at is not None else state.entered_at
    if event.age_s < now - since:
        return _conclude(state, now, charged=True, down=False)  # another call was served
    if state.rules.outage_charge == "waiting":
        return _conclude(state, now, charged=False, down=True)
    return Step(replace(state, phase="outage_breaker"), AskBreaker(state.attempt.source))


def outage_breaker(state: CallState, event: Event, now: float) -> Step:
    """A direct caller cannot park: its ambiguous failure is waiting only while the
    source's breaker shows the outage fleet-wide (rule 15 as amended)."""
    assert isinstance(event, BreakerState)
    down = event.state != "closed"
    return _conclude(state, now, charged=not down, down=down)


def _conclude(
    state: CallState, now: float, *, charged: bool, down: bool, refund: bool = False
) -> Step:
    """The attempt's trail line and its time: productive unless refunded to waiting (an
    exempt 429; an outage's failure, unless it is the call's first: rule 5)."""
    attempt = state.attempt
    assert attempt is not None
    outcome = _outcome(state)
    refunded = refund or (down and state.failed_at is not None)
    record = AttemptRecord(
        source=attempt.source,
        outcome=outcome.kind.value,
        seconds=now - attempt.started,
        started_s=attempt.started - state.entered_at,
        status=outcome.status,
        reason=outcome.reason,
        burned_budget=charged,
        productive=not refunded,
    )
    productive_s = state.productive_s if refunded else state.productive_s + (now - attempt.started)
    state = replace(
        state,
        phase="record",
        outage_fails=state.outage_fails + 1 if down else state.outage_fails,
        failed_at=state.failed_at if outcome.kind is OutcomeKind.SUCCESS else now,
        trail=(*state.trail, record),
        productive_s=productive_s,
        attempt=replace(attempt, charged=charged),
    )
    return Step(state, Record(record, outcome))


def recorded(state: CallState, event: Event, now: float) -> Step:
    """Judge the attempt: a verdict, or a backoff before the next round."""
    attempt = state.attempt
    assert attempt is not None
    outcome = _outcome(state)
    source, kind, rules = attempt.source, outcome.kind, state.rules
    if kind is OutcomeKind.SUCCESS:
        return Step(state, Return(source, outcome))
    state = replace(state, last_error=f"{source}: {error_text(outcome)}", fleet_error=False)
    if kind is OutcomeKind.FATAL:
        return Step(state, Fail(outcome.reason or "fatal", source, outcome.status))
    if now >= state.deadline:
        return give_up(state, now, "deadline")  # e.g. an attempt the deadline cut short
    last_failure = {**dict(state.last_failure), source: len(state.trail)}
    state = replace(state, last_failure=tuple(last_failure.items()))
    if kind is OutcomeKind.RATE_LIMITED:
        hint = state.sane_hint(outcome.retry_after_s)
        if hint is not None and not state.reopening_known(now):
            state = replace(state, reopen_at=now + hint, reopen_is_reset=True)
    if attempt.charged:
        state = replace(state, fails=state.fails + 1)
        if kind is OutcomeKind.REJECTED:
            state = replace(state, excluded=state.excluded | {source})
            if state.excluded.issuperset(rules.sources):
                reason = f"no source left: {outcome.reason or 'rejected'}"
                return Step(state, Fail(reason, source, outcome.status))
    state = _plan_next(state, source, outcome, now)
    if state.fails >= rules.max_attempts:
        return give_up(state, now, "retry_exhausted")
    return _backoff(state, outcome, attempt.charged, now)


def _plan_next(state: CallState, source: str, outcome: Outcome, now: float) -> CallState:
    """Where the attempt after this failure goes: back to `source` once after a 5xx
    or a connection error; onto `source` again after its own short Retry-After if it
    is the scope's first choice; elsewhere for anything else."""
    rules = state.rules
    if outcome.kind is OutcomeKind.TRANSIENT and same_source_worth_retrying(outcome):
        tries = dict(state.same_tries)
        if tries.get(source, 0) < rules.same_source_retries:
            tries[source] = tries.get(source, 0) + 1
            return replace(state, same_tries=tuple(tries.items()), stay_on=source)
    elif outcome.kind is OutcomeKind.RATE_LIMITED:
        hint = state.sane_hint(outcome.retry_after_s)
        first = next((s for s in rules.sources if s not in state.excluded), None)
        short = hint is not None and hint <= rules.wait_out_retry_after_s
        if short and source == first and not rules.fail_fast:  # fail_fast: never wait
            assert hint is not None
            return replace(state, hold_on=(source, now + hint))
    return state


def _backoff(state: CallState, outcome: Outcome, charged: bool, now: float) -> Step:
    """The delay after a failure (rule 4): an exempt 429's grows on the rate-limited
    streak's own counter (reset by any other outcome), anything else on the call's
    failures of both kinds. A cut first token fails over at once (rule 17)."""
    rules = state.rules
    if outcome.kind is OutcomeKind.RATE_LIMITED and not charged:
        state = replace(state, rate_limited_streak=state.rate_limited_streak + 1)
        n = state.rate_limited_streak
    else:
        state = replace(state, rate_limited_streak=0)
        n = state.fails + state.outage_fails
    cap_s = state.deadline - now
    if not charged and outcome.kind is OutcomeKind.TRANSIENT and rules.scope_gate:
        # A task that parks ends an outage's backoff one poll past its stall budget at
        # most, so the verdict is not put off by a long backoff (rule 16).
        remaining = max(0.0, rules.stall_window_s - state.stalled_s(now))
        cap_s = min(remaining + rules.poll_interval_s, cap_s)
    if outcome.first_token_cut:
        cap_s = min(0.0, cap_s)
    ceiling = backoff_ceiling(n, rules.backoff_base_s, rules.backoff_max_s)
    return Step(replace(state, phase="backoff"), Wait("backoff", ceiling, True, cap_s))


def after_backoff(state: CallState, event: Event, now: float) -> Step:
    attempt = state.attempt
    assert attempt is not None
    if not attempt.charged and not state.rules.rate_limit_exempt:
        step = check_stall(state, now, "backoff_stall")  # an outage is waiting (rule 15)
        if step is not None:
            return step
    return begin_round(state, event, now)


def after_backoff_stall(state: CallState, event: Event, now: float) -> Step:
    return (
        give_up(state, now, "stalled") if stalled(state, event) else begin_round(state, event, now)
    )


def _outcome(state: CallState) -> Outcome:
    assert state.attempt is not None
    assert state.attempt.outcome is not None
    return state.attempt.outcome
