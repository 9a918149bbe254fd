"""Store layer: the protocol of atomic governance operations every store implements.

Each operation is one atomic step, so the Redis store can run each as a single
Lua script: `admit` (selection + permit + breaker + AIMD + pause + quota) and
`settle` (release + breaker + AIMD + pause + quota + progress) are the two round
trips of a successful attempt. The algorithms (breaker, AIMD, GCRA) are the
decision core's; a store only keeps their state and applies them atomically.

Times a store hands back are durations, never instants: the store keeps its own
clock (Redis ``TIME``), the loop keeps the local monotonic one, and the two are
never mixed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from polygate_celery.core.breaker import BreakerMode, Effect
from polygate_celery.core.engine import Refused
from polygate_celery.core.engine.message import message
from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.selection import BlockReason as BlockReason  # noqa: PLC0414 (the store names it)
from polygate_celery.core.standing import PLAIN, Standing, tenant_of
from polygate_celery.core.terms import QuotaTerms, SourceTerms

# How long a scope's last success counts (`Store.progress_age_s`: older is none).
PROGRESS_TTL_S = 3600.0

# How long a tenant's record of its permits at a source is kept after its last grant
# there: longer than any attempt runs (a source's `timeout_s` is at most a day).
TENANT_KEPT_S = 2 * 86400.0

# How long a gate that opened by time stays on record as its scope's stall: a later
# close within it is the same outage, and a success ends it (`Store.close_gate`).
GATE_KEPT_S = 60.0


class WaitMode(Enum):
    """How a caller refused at admission waits (`AdmitRequest.wait`), and so where the
    store must look for what a past refusal left it: a place in a queue, a permit handed
    to it, a booked quota slot."""

    NONE = "none"  # it does not wait (no claim, or no call id): nothing is kept for it
    JOIN = "join"  # it waits, and is in no queue (not refused since its last grant)
    QUEUED = "queued"  # it waits, and may be queued: a permit may have been handed to it
    BOOKED = "booked"  # likewise, and it may hold a booked quota slot


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    """Ask for a permit at the first runnable source of `candidates` (best first).

    `permit_id` is chosen by the caller so that a retried admit is idempotent.
    With `claim_s` > 0 the caller (`call_id`) will wait if refused: a fleet-wide
    store queues it, first come first served, for the sources that refused it for
    capacity alone, and hands it a released permit, held for it `claim_s` (the
    caller asks again within that, or drops out of the queue). `queued` False says
    the caller is in no queue (it has not been refused since its last grant, or ever):
    the store need not look for it there, nor for a permit handed to it.

    With `book_within_s` > 0 too, a caller refused by quota buckets alone (no sliding
    window) books the soonest slot they can give it, if within that many seconds: the
    quota is charged for it at once (`core.quota.gcra_book`) and, asking again from the
    slot on (its claim long after), it is admitted there without a second charge. So
    callers waiting for a quota are served in the order they booked, one per refill,
    instead of all asking again at each refill. A booking is made at one source at a
    time; one not used within its claim after the slot lapses (its units stay spent).
    `booked` False says the caller holds no booking (it was told of none since its last
    grant): the store need not look for one.

    Stores read these four fields together, as `wait` (a `WaitMode`), never one by one.

    `arrival` is the call's place among the waiters of its class, first come first
    served: the store's time of the call's first grant (`Grant.admitted_at`, in
    microseconds) or booking (`Denial.arrival`), None before either. A call that asks again
    after a failed attempt, or whose booked slot a higher class took, keeps it: it
    takes the soonest slot a later call of its class booked (`core.standing.takes_later`;
    admit_booking.lua's `take_booked`). A booker robbed of its slot is booked that one at
    once by the store and told (`ReleaseWatch.moved`), unless a class above its own took
    the slot while its own class has a floor: it asks again then.
    A caller gives the arrival its booking's denial told it: the Redis store finds the
    booking by it (a caller that lost that reply books a second slot).

    `tag` is, for a call of a tenant, its place among the waiters of its class on a
    quota's slots instead: its fair-queuing tag there (`core.standing.quota_tag`), given
    by its first booking (`Denial.tag`), None before. It takes the soonest slot a call of
    its class with a higher tag booked, so tenants share the slots by weight, in tokens.
    A caller gives it back with each later ask, as it gives the arrival.

    `standing` is where the caller stands among the waiters of a source (SPEC §8): its
    priority class's rank, its tenant and the tenant's weight, and the classes' floors
    (`core.standing`), resolved once per call from the configuration
    (`GatewayConfig.standing`). The stores order their queues by it: a higher class
    first, within the floors, then tenants by weighted fair queuing on tokens
    (`est_tokens` being the call's cost); `PLAIN` (one class, no tenant) is first come,
    first served.
    """

    scope: str
    candidates: tuple[SourceTerms, ...]
    permit_id: str
    est_tokens: int = 0
    gate: bool = False
    call_id: str = ""
    probe_lease_s: float = 0.0
    claim_s: float = 0.0
    queued: bool = True
    book_within_s: float = 0.0
    booked: bool = True
    standing: Standing = PLAIN
    arrival: int | None = None
    tag: float | None = None

    @property
    def wait(self) -> WaitMode:
        """The flags read together: how this caller waits if refused."""
        if self.claim_s <= 0 or not self.call_id:
            return WaitMode.NONE
        if not self.queued:
            return WaitMode.JOIN
        return WaitMode.BOOKED if self.booked else WaitMode.QUEUED


@dataclass(frozen=True, slots=True)
class Grant:
    """A permit at `source`. `admitted_at` is in the store's clock (for AIMD episodes).

    `lease_s` is set when the permit is a lease that expires unless renewed
    (the Redis store): the holder renews it while its attempt runs.
    `probe` says the permit is its source's half-open probe, the one request the
    breaker lets through after its cooldown (the store that granted it logged the
    breaker's turn to half-open, once fleet-wide).
    """

    source: str
    permit_id: str
    admitted_at: float
    lease_s: float | None = None
    probe: bool = False


@message
class Denial(Refused):
    """No candidate was runnable: the engine's `Refused`, as a store hands it back
    (its fields are described there)."""


@dataclass(frozen=True, slots=True)
class Settlement:
    """The end of the attempt that held `permit_id`, and what the store must record.

    `effect` drives the breaker; `congested` asks for an AIMD decrease (a 429
    or a timeout); a SUCCESS also increases the AIMD limit and marks the scope's
    progress. `pause_s` pauses the source fleet-wide (a later pause is kept).
    `used_tokens` is charged in place of the `est_tokens` reserved at admission
    (0 refunds the estimate). `limits`, the provider's own rate-limit headers,
    teach the source's learned quota (`core.quota.learned_tat`). `error` says
    what a failed attempt met (``"transient (HTTP 503): connection refused"``,
    classified and redacted): the log line of a state change it causes names it, and
    the store keeps it as the source's last error when the settle records a failure
    (a held permit's transient or credentials failure) or a pause; a success while
    no pause runs forgets it (`Denial.errors`). `rank`, the call's priority class where
    classes are declared: a SUCCESS marks that class's progress too (SPEC §8).
    `standing`, where the call stood among a source's waiters: its tenant's share is
    counted in the tokens used, not the estimate (`core.standing.corrected`).
    """

    scope: str
    source: SourceTerms
    permit_id: str
    admitted_at: float
    effect: Effect
    congested: bool = False
    pause_s: float | None = None
    est_tokens: int = 0
    used_tokens: int = 0
    limits: RateLimits | None = None
    error: str | None = None
    rank: int | None = None
    standing: Standing = PLAIN


class ReleaseWatch(Protocol):
    """A watch on permit releases, started when it is created (see `Store.watch_releases`)."""

    async def wait(self) -> None:
        """Return once a watched permit was released since the watch started (or the
        call's booked slot moved: `moved`)."""
        ...

    def moved(self) -> float | None:
        """Seconds until the quota slot the watching call was booked instead of the one it
        booked, when a call served before it took that (told since it last asked, and no
        release woke it); None otherwise. A later `wait` waits again."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class TenantSnapshot:
    """A tenant's calls at a source (told by their ids, `core.standing.named_for`): holding
    its permits, waiting for them, and holding a quota slot booked ahead at it."""

    tenant: str
    in_flight: int = 0
    waiting: int = 0
    booked: int = 0


def tenants_of(
    in_flight: Iterable[str], waiting: Iterable[str], booked: Iterable[str]
) -> tuple[TenantSnapshot, ...]:
    """Per tenant, in its name's order, the ids of each kind named for it (calls and
    permits of no tenant left out)."""
    counts: dict[str, list[int]] = {}
    for kind, ids in enumerate((in_flight, waiting, booked)):
        for ident in ids:
            tenant = tenant_of(ident)
            if tenant:
                counts.setdefault(tenant, [0, 0, 0])[kind] += 1
    return tuple(TenantSnapshot(t, *counts[t]) for t in sorted(counts))


@dataclass(frozen=True, slots=True)
class SourceSnapshot:
    """A source's governance state, for status views and tests."""

    name: str
    permits_in_use: int
    permit_limit: int
    breaker: BreakerMode
    breaker_failures: int
    paused_for_s: float
    learned_rpm: int | None = None  # the limits the provider announced, once it has
    learned_tpm: int | None = None
    # Calls waiting for its permits, per priority class (by rank; trailing classes with
    # none left out), and the classes' recent grants (counters decayed per grant, kept
    # where floors are declared: `core.standing`).
    waiting: tuple[int, ...] = ()
    recent_grants: tuple[float, ...] = ()
    # Calls holding a quota slot booked ahead at it, per priority class (by rank).
    booked: tuple[int, ...] = ()
    # Per tenant with calls there: in flight, waiting, booked (`TenantSnapshot`).
    tenants: tuple[TenantSnapshot, ...] = ()


@dataclass(frozen=True, slots=True)
class QuotaSnapshot:
    """How much of a quota's one-minute allowance is spent now, per dimension.

    Requests counted in a sliding window: the admissions still in it. Otherwise
    read from the bucket (GCRA) state: a theoretical arrival time `t` seconds
    ahead of now means ``t / 60`` of the minute's allowance is spent (a full
    minute's worth may be spent at once, then it refills evenly). None where the
    quota has no such limit.
    """

    name: str
    requests_used: float | None
    tokens_used: float | None


@runtime_checkable
class Store(Protocol):
    """Governance state shared by every call (and, for Redis, every worker).

    Any failure to answer raises `GovernanceBackendError`: the loop then sends
    nothing (fail closed).
    """

    async def admit(self, request: AdmitRequest) -> Grant | Denial: ...

    async def settle(self, settlement: Settlement) -> bool:
        """Release the permit and record the attempt; False if it was no longer held.

        For a permit no longer held (settled already, or reclaimed after its
        lease expired while its answer came) only the facts safe to record twice
        are kept: the pause, the provider's announced limits and what a success
        shows (the scope's progress; the source serving: breaker closed, AIMD
        increase). Nothing is released: the permit may be another call's now.
        """
        ...

    async def renew(self, leases: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        """Extend each ``(source, permit id, lease_s)`` lease, in one operation.

        Returns, per lease, whether the permit was still held (False: it was
        reclaimed or settled, and is not renewed).
        """
        ...

    async def keep_places(self, places: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        """Renew the claims of waiting calls on their places in the sources' queues, in
        one operation: ``(source, call id, claim_s)`` each (see `AdmitRequest`).

        Returns, per place, whether the call still waits there, its claim now ending
        `claim_s` from now (False: a release handed it a permit, or passed it over
        after its claim ran out; it asks again). A source of these places that can
        run a call while its queue is not empty (a holder's lease expired, a pause
        ended since the last release) hands a permit to the first live waiter, as a
        release does, so waiters that keep their places need not ask again to notice.
        """
        ...

    async def progress_age_s(self, scope: str, rank: int | None = None) -> float:
        """Seconds since the scope's last success, in the store's clock; ``inf`` if none.
        With `rank`, since the last success of a call of that priority class (SPEC §8: a
        class's stall verdict reads its own progress)."""
        ...

    async def mark_progress(self, scope: str, rank: int | None = None) -> None:
        """Record a success in `scope` now (a success settled elsewhere, e.g. a reused
        result), and of its class `rank`, if given."""
        ...

    async def close_gate(
        self,
        scope: str,
        seconds: float,
        reset: bool = False,
        call_id: str = "",
        error: str | None = None,
    ) -> bool:
        """Close the scope's gate for `seconds` (a later close is kept); a success opens it.

        True when the gate was open: this call closed it, and its caller says so, once
        across the fleet. `error`, the closing verdict's last error (classified, no
        secret), is kept with the gate for the calls it refuses (`Denial.gated_error`).

        `reset` says the gate opens when rate limits reset (the closing verdict's
        `rate_limited`); refused calls learn it from their `Denial`. `call_id` is the
        closing call's: if it holds the gate's probe, its probe is over and the slot is
        free. Another call's probe stays until its lease ends (`probe_lease_s`), so
        however many stalled verdicts race, one call at a time probes fleet-wide.
        """
        ...

    async def pause_source(self, source: str, seconds: float) -> None:
        """Pause `source` fleet-wide for `seconds`, keeping a later existing pause."""
        ...

    async def resume_source(self, source: str) -> None:
        """Lift `source`'s pause fleet-wide (an operator's override of a Retry-After)."""
        ...

    async def reset_source(self, source: str) -> None:
        """Forget `source`'s breaker, adaptive limit and pause: it starts afresh.

        The limit goes back to its initial value (the terms' `initial_limit`,
        else the cap). Permits held now stay held, and settle as usual. The
        limits the provider announced are kept: they are the provider's.
        """
        ...

    async def gate_closed_for_s(self, scope: str) -> float:
        """Seconds the scope's gate stays closed (see `close_gate`); 0.0 when it is open."""
        ...

    async def quota_snapshot(self, quota: QuotaTerms) -> QuotaSnapshot:
        """How much of `quota`'s minute is spent now (read-only, for status views)."""
        ...

    def watch_releases(self, sources: Sequence[str], call_id: str = "") -> ReleaseWatch:
        """Start watching for a released permit of one of `sources`, as of now (for
        the call `call_id`: a fleet-wide store wakes it when a permit is handed to it).

        Synchronous, so a caller that starts the watch before asking for a
        permit misses no release that happens after the refusal. A watch may
        fire spuriously; callers race it against their poll timer. Use it as a
        context manager to stop watching.
        """
        ...

    async def snapshot(self, source: SourceTerms) -> SourceSnapshot: ...

    async def aclose(self) -> None:
        """Release what the store holds (connections, listeners); nothing to do in memory.

        Call it once, after the last call has ended.
        """
        ...
