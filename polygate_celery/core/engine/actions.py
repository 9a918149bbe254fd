"""Decision core: what the engine asks a driver to do (actions) and what it hears back (events).

Actions are plain records, frozen to the type checker (`message`); a driver
carries each out against the store, the source and the clock, and answers with
the event named in its docstring.
The verdicts (`Return`, `GiveUp`, `Fail`) end the call.
"""

from __future__ import annotations

from typing import Literal

from polygate_celery.core.breaker import Effect
from polygate_celery.core.engine.message import message
from polygate_celery.core.outcome import AttemptRecord, Outcome
from polygate_celery.core.selection import BlockReason

WaitCause = Literal["no_runnable", "backoff"]

# -- actions -------------------------------------------------------------------


@message
class AskProgress:
    """Ask the store for the scope's progress age (its clock); answer `ProgressAge`.
    `own_class`: the progress of the call's own priority class, where classes are
    declared (the stall verdict, SPEC §8: a call starved by a higher class is stalled);
    else of any call of the scope (an outage is the scope's, rule 15)."""

    own_class: bool = False


@message
class AskBreaker:
    """Ask the store for `source`'s breaker state; answer `BreakerState`."""

    source: str


@message
class Admit:
    """Ask for a permit at the first runnable source of `order` (best first), watching
    for releases from before the ask; answer `Granted` or `Refused`."""

    order: tuple[str, ...]
    claim_s: float
    queued: bool
    booked: bool
    book_within_s: float


@message
class Send:
    """Send the payload to `source` under its permit (asked for at `asked_at`), cut to
    `timeout_s`; a slow first token may be cut only if a source outside `excluded`
    could serve (rule 17). Answer `Sent`."""

    source: str
    timeout_s: float
    asked_at: float
    excluded: frozenset[str]


@message
class Settle:
    """Record the attempt's end at the store and give its permit back; answer `Settled`.
    A success whose recording fails is kept (rule 14)."""

    outcome: Outcome
    effect: Effect
    congested: bool
    pause_s: float | None
    used_tokens: int
    error: str | None


@message
class Record:
    """A line of the call's trail, for telemetry; answer `Done`."""

    record: AttemptRecord
    outcome: Outcome


@message
class Wait:
    """Sleep `seconds` (times the jitter of one uniform draw when `jittered`), cut to
    `cap_s`; no sleep at all when that leaves nothing. A `no_runnable` wait also ends
    when a permit is released; with `queue`, the call keeps its places in the
    candidates' queues meanwhile and the wait ends if they are lost. Answer `Waited`."""

    cause: WaitCause
    seconds: float
    jittered: bool
    cap_s: float
    queue: bool = False


@message
class Return:
    """Verdict: the call succeeded at `source`."""

    source: str
    outcome: Outcome


@message
class GiveUp:
    """Verdict: `AllSourcesExhausted(reason)`, with the scope's reopening estimate;
    `capped`: stalled by its tenant's own caps alone (SPEC §8), not by the scope."""

    reason: Literal["stalled", "retry_exhausted", "fail_fast", "deadline"]
    retry_after_s: float
    rate_limited: bool
    capped: bool = False


@message
class Fail:
    """Verdict: `SourceFatalError` at `source` (never retried)."""

    reason: str
    source: str
    status: int | None


Action = AskProgress | AskBreaker | Admit | Send | Settle | Record | Wait | Return | GiveUp | Fail

# -- events --------------------------------------------------------------------


@message
class Begin:
    """The call starts."""


@message
class Done:
    """The action was carried out and says nothing back."""


@message
class ProgressAge:
    """Seconds since the scope's last success on the store's clock (inf: never)."""

    age_s: float


@message
class BreakerState:
    state: str


@message
class Granted:
    source: str


@message
class Refused:
    """No candidate was runnable (a store hands it back as its `Denial`).

    `reopen_in_s` is the soonest known time until one may be, or None when no
    blocker has a known end (every source is at capacity or probing).
    `gated_for_s` is set when the scope's gate refused the call: it stays
    closed that much longer, unless a probe succeeds first; `gated_reset` says
    the gate was closed until rate limits reset (see `Store.close_gate`).
    `booked_in_s` is set when the caller holds a booking of a quota's slot (see
    `AdmitRequest.book_within_s`): it may ask again that much later and be admitted;
    `arrival` then is the call's place among the waiters of its class, which it gives
    with each later ask (`AdmitRequest.arrival`), and `tag`, for a call of a tenant, its
    fair-queuing tag on the quota (`AdmitRequest.tag`).
    `gated_error` is the last error of the verdict that closed the gate: a call the
    gate refuses names it, as its own verdict's last error.
    `errors` holds ``(source, last error)`` for each candidate refused by its breaker
    (open, or half-open with its probe in flight) or by a pause whose failure the
    store keeps (the classified text a settle recorded, e.g. ``"transient: connection
    refused"``): a call refused before it sent anything names the fleet's evidence.
    """

    reopen_in_s: float | None
    blocked: tuple[tuple[str, BlockReason], ...]
    gated_for_s: float | None = None
    gated_reset: bool = False
    booked_in_s: float | None = None
    gated_error: str | None = None
    errors: tuple[tuple[str, str], ...] = ()
    arrival: int | None = None
    tag: float | None = None


@message
class Sent:
    outcome: Outcome


@message
class Settled:
    """The store recorded the attempt (or failed to record a success, which was kept)."""


@message
class Waited:
    """The wait ended: `woken` before its delay by a release, `lost` its places, or
    `moved_in_s` set: the quota slot the call booked was taken by a call served before
    it, and the store booked it the next one it comes to, that many seconds ahead (it
    waits on for it without asking: `Refused.booked_in_s`)."""

    woken: bool = False
    lost: bool = False
    moved_in_s: float | None = None


Event = Begin | Done | ProgressAge | BreakerState | Granted | Refused | Sent | Settled | Waited
