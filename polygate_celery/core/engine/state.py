"""Decision core: the frozen state of one governed call and the terms it is judged by.

Two clocks, never mixed (SPEC §3 rule 11): every instant here (`entered_at`,
`failed_at`, `reopen_at`, ...) is on the local monotonic clock the driver reads
and passes in as `now`; the scope's progress age is a duration on the store's
clock, only ever compared with a duration of this call. The stall time is the
complement of the productive time, ``(now - entered_at) - productive_s``
(rule 1): an attempt adds its span to `productive_s` unless it is refunded to
the stall budget (an exempt 429, an outage's failure after the call's first).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

from polygate_celery.core.engine.actions import Action, Refused
from polygate_celery.core.outcome import AttemptRecord, Outcome

# Where a transient failure goes when the scope made no progress since the call's
# previous failure, so nothing tells it from an outage (SPEC §3 rule 15): to waiting;
# to waiting only while its source's breaker is open (fleet-wide evidence); or to the
# retry budget.
OutageCharge = Literal["waiting", "waiting_if_breaker_open", "retry_budget"]
# Blockers whose end is when a rate limit resets: a provider's Retry-After, a quota, a
# tenant's own caps.
RATE_LIMIT_BLOCKS: frozenset[str] = frozenset({"paused", "quota", "tenant_cap"})

Phase = Literal[
    "start",  # before the first round
    "top_stall",  # the top-of-round stall check asked for the progress age
    "admit",  # a permit was asked for
    "denied_stall",  # after a refusal, the stall check asked for the progress age
    "poll",  # waiting after a refusal, then a new round
    "queued",  # waiting in the candidates' queues
    "queued_stall",  # between two waits in the queues, the stall check
    "send",  # the attempt is out
    "settle",  # its end is being recorded
    "outage_progress",  # rule 15: did the scope progress since the previous failure?
    "outage_breaker",  # rule 15 for a direct caller: is the source's breaker open?
    "record",  # its trail line is being emitted
    "backoff",  # the backoff after a failure
    "backoff_stall",  # after an outage's backoff, the stall check
]


@dataclass(frozen=True)
class CallRules:
    """What the engine reads about one call: its scope's settings and its options."""

    sources: tuple[str, ...]
    timeouts: Mapping[str, float]
    rate_limit_exempt: bool
    max_attempts: int
    stall_window_s: float
    max_call_s: float
    backoff_base_s: float
    backoff_max_s: float
    poll_interval_s: float
    retry_after_cap_s: float
    claim_s: float
    outage_charge: OutageCharge = "waiting"
    same_source_retries: int = 1
    wait_out_retry_after_s: float = 5.0
    est_tokens: int = 0
    fail_fast: bool = False
    scope_gate: bool = False


@dataclass(frozen=True)
class Attempting:
    """The attempt in flight: where, since when, under which cut of its timeout."""

    source: str
    started: float
    timeout_s: float
    full_timeout_s: float
    outcome: Outcome | None = None
    charged: bool = False


@dataclass(frozen=True)
class CallState:
    """One call, frozen: each decision returns a new one."""

    rules: CallRules
    entered_at: float
    phase: Phase = "start"
    round: int = 0  # rounds begun (one ask for a permit each)
    productive_s: float = 0.0  # time of attempts that burn the retry budget
    fails: int = 0  # failures charged to the retry budget
    outage_fails: int = 0  # transient failures charged to waiting (rule 15)
    failed_at: float | None = None  # when this call's latest failure ended
    rate_limited_streak: int = 0  # consecutive 429s exempt from the retry budget
    same_tries: tuple[tuple[str, int], ...] = ()  # retries of a source right after it failed
    stay_on: str | None = None  # the source the next attempt retries first
    hold_on: tuple[str, float] | None = None  # a short Retry-After waited out on it
    trail: tuple[AttemptRecord, ...] = ()
    excluded: frozenset[str] = frozenset()
    last_failure: tuple[tuple[str, int], ...] = ()  # source -> trail length at its failure
    reopen_at: float | None = None
    reopen_is_reset: bool = False  # reopen_at is when rate limits reset, not a guess
    last_error: str | None = None
    fleet_error: bool = False  # last_error is the fleet's evidence, not this call's own
    gated: bool = False
    refused: bool = False  # refused since its last grant: it may be in a store's queue
    booked: bool = False  # told since its last grant that it booked a quota's slot
    asked_at: float = 0.0  # when the round's permit was asked for
    order: tuple[str, ...] = ()  # the round's candidates, best first
    refusal: Refused | None = None  # the round's refusal
    checked_stalled_s: float = 0.0  # the stall time a pending stall check compares
    attempt: Attempting | None = None

    @property
    def deadline(self) -> float:
        """`max_call_s` after the call began: every wait and attempt is cut to it."""
        return self.entered_at + self.rules.max_call_s

    def elapsed_s(self, now: float) -> float:
        return now - self.entered_at

    def stalled_s(self, now: float) -> float:
        """Stall time (rule 1): everything but attempts that burn the retry budget."""
        return self.elapsed_s(now) - self.productive_s

    def reopening_known(self, now: float) -> bool:
        return self.reopen_at is not None and self.reopen_at > now

    def retry_after_s(self, now: float) -> float:
        """Soonest known reopening of the scope, clamped (SPEC §3 rule 7).

        A reopening that has already passed is no longer known: the estimate
        then falls back to `stall_window_s`.
        """
        rules = self.rules
        if self.reopen_at is not None and self.reopening_known(now):
            estimate = self.reopen_at - now
        else:
            estimate = rules.stall_window_s
        return min(max(estimate, rules.poll_interval_s), rules.retry_after_cap_s)

    def sane_hint(self, seconds: float | None) -> float | None:
        """A provider's or store's reopening hint, if usable: finite, positive, capped."""
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            return None
        return min(seconds, self.rules.retry_after_cap_s)


R = TypeVar("R")


def replace(record: R, /, **changes: Any) -> R:
    """`record`, a frozen dataclass, with `changes`: `dataclasses.replace` without its
    per-field walk and `__init__` (a call makes about ten of these, and
    `dataclasses.replace` on a record this wide added some 40 µs to every call). The
    engine's records keep their fields in `__dict__` (no slots) so that a copy is one
    dictionary update. An unknown name raises `TypeError`, as with `dataclasses.replace`
    (found after the copy, by its size: an unknown name adds a key)."""
    new = _new(type(record))
    values = new.__dict__
    values.update(record.__dict__)
    values.update(changes)
    if len(values) != len(record.__dict__):
        unknown = ", ".join(sorted(changes.keys() - record.__dict__.keys()))
        raise TypeError(f"{type(record).__name__} has no field {unknown}")
    return new


_new = object.__new__


def initial_state(rules: CallRules, entered_at: float) -> CallState:
    """A call's first state: `CallState(rules=rules, entered_at=entered_at)`, copied from
    the fields' defaults (a frozen dataclass's `__init__` sets its thirty fields one
    `object.__setattr__` at a time)."""
    state = _new(CallState)
    state.__dict__.update(_INITIAL, rules=rules, entered_at=entered_at)
    return state


# Every field of `CallState` but `rules` and `entered_at` has a default, none a factory.
_INITIAL: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(CallState) if f.default is not dataclasses.MISSING
}


class Step(NamedTuple):
    """A decision: the call's next state and what to do."""

    state: CallState
    action: Action


def error_text(outcome: Outcome) -> str:
    """A failed attempt as its log lines and verdicts name it: ``transient (HTTP 503):
    upstream error`` (kind, status, classified reason; never a body or a key)."""
    status = f" (HTTP {outcome.status})" if outcome.status is not None else ""
    reason = f": {outcome.reason}" if outcome.reason else ""
    return f"{outcome.kind.value}{status}{reason}"


def same_source_worth_retrying(outcome: Outcome) -> bool:
    """A 5xx (or 408/409) or a connection error: often gone on the next try. A timeout
    (a silent route) or a malformed answer moves to another source at once."""
    if outcome.timed_out:
        return False
    if outcome.status is None:
        return True  # refused, reset, closed: no answer at all
    return outcome.status >= 500 or outcome.status in (408, 409)
