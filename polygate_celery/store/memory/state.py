"""Store layer (memory): the state the in-memory store keeps, per source, quota, scope.

Each record keeps what the Redis store keeps in its keys (see the scripts'
headers): a source's breaker, adaptive limit, permits, pause, queue of waiting
calls, permits handed to them, booked quota slots and last error; a quota's
buckets and sliding window; a scope's gate and last success. `Ledger` holds them
all, with the store's release hub.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from polygate_celery.core.aimd import AimdState, aimd_initial, aimd_permits
from polygate_celery.core.breaker import BreakerState
from polygate_celery.core.quota import WINDOW_S
from polygate_celery.core.standing import (
    RANK_SPAN,
    Standing,
    next_class,
    rank_of,
    score,
    served_counts,
    tag,
)
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store.memory.learned import Learned
from polygate_celery.store.releases import ReleaseHub

# A booking's tag when its call has no tenant (tags are never negative).
NO_TAG = -1.0

# Tenants' last tags kept before those behind their class's virtual time are forgotten.
SWEEP_ABOVE = 64


@dataclass
class Fair:
    """A source's fair-queuing state (`core.standing`): per class its virtual time and
    grant counter, per class and tenant the last tag given, and the classes' floors."""

    virtual: dict[int, float] = field(default_factory=dict)
    finish: dict[tuple[int, str], float] = field(default_factory=dict)
    counts: dict[int, float] = field(default_factory=dict)
    floors: tuple[float, ...] = ()

    def sweep(self) -> None:
        """Forget the tenants' last tags their class's virtual time has reached (they count
        as none, `core.standing.tag`), once more than `SWEEP_ABOVE` are kept: tenants that
        come and go leave nothing behind (as settle.lua sweeps its state hash)."""
        if len(self.finish) > SWEEP_ABOVE:
            for key, tag_ in list(self.finish.items()):
                if tag_ <= self.virtual.get(key[0], 0.0):
                    del self.finish[key]


@dataclass
class TenantHold:
    """A tenant's use of a source against its caps (`core.standing.caps_say`): the permits
    its calls were granted there (those the source still holds are in flight) and its
    buckets' theoretical arrival times."""

    permits: set[str] = field(default_factory=set)
    request_tat: float = -math.inf
    token_tat: float = -math.inf

    def in_flight(self, held: set[str]) -> int:
        """Its calls in flight: its permits the source still holds (`held`); the others
        are forgotten."""
        self.permits &= held
        return len(self.permits)


@dataclass
class SourceState:
    aimd: AimdState | None = None  # set from the source's terms on first use
    breaker: BreakerState = field(default_factory=BreakerState)
    permits: set[str] = field(default_factory=set)
    paused_until: float = -math.inf
    learned: Learned = field(default_factory=Learned)
    # Waiting calls: call id -> (end of its claim, claim_s, its score: class, then
    # fair-queuing tag, `core.standing`); and permits a release handed to one of
    # them: call id -> end of its claim.
    queue: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    fair: Fair = field(default_factory=Fair)
    handed: dict[str, float] = field(default_factory=dict)
    # The classes' credits on its quota slots (`core.standing.used_credits`), by rank.
    slot_credits: dict[int, float] = field(default_factory=dict)
    # Quota slots booked by waiting calls: call id -> [slot, end of its claim, class rank,
    # estimated tokens, arrival (`AdmitRequest.arrival`), fair-queuing tag on the quota
    # (`AdmitRequest.tag`; `NO_TAG` for a call of no tenant)].
    booked: dict[str, list[float]] = field(default_factory=dict)
    # The tenants' fair queuing on its quota's slots (`core.standing.quota_tag`): per class,
    # the tag of the last booked slot used; per class and tenant, the last tag given.
    quota_fair: Fair = field(default_factory=Fair)
    # Tenants with caps: their use of this source (`TenantHold`), by tenant.
    tenants: dict[str, TenantHold] = field(default_factory=dict)
    # The source's last error (as settle.lua keeps it), and when its breaker last opened.
    error: str | None = None
    opened_at: float | None = None

    def forget_idle_tenants(self, now: float) -> None:
        """Once more than `SWEEP_ABOVE` tenants are on record, forget those with no call in
        flight whose buckets have refilled: as fresh ones (the Redis keys expire alike)."""
        if len(self.tenants) > SWEEP_ABOVE:
            for tenant, hold in list(self.tenants.items()):
                idle = not hold.in_flight(self.permits)
                if idle and max(hold.request_tat, hold.token_tat) <= now:
                    del self.tenants[tenant]

    def booking(self, call_id: str, now: float) -> list[float] | None:
        """The call's booking here, unless it lapsed (then it is dropped)."""
        booking = self.booked.get(call_id)
        if booking is not None and booking[1] <= now:
            del self.booked[call_id]
            return None
        return booking

    def in_use(self, now: float) -> int:
        """Permits held, and handed to waiters whose claim has not ended."""
        for call_id, claim_end in list(self.handed.items()):
            if claim_end <= now:
                del self.handed[call_id]
        return len(self.permits) + len(self.handed)

    def join(
        self, call_id: str, standing: Standing, est_tokens: int, claim_s: float, now: float
    ) -> None:
        """The call joins the queue, its place given by its standing; or, queued
        already, keeps its place and renews its claim."""
        place = self.queue.get(call_id)
        if place is not None:
            self.queue[call_id] = (now + claim_s, claim_s, place[2])
            return
        fair, rank = self.fair, standing.rank
        key = (rank, standing.tenant)
        fair.finish[key] = tagged = tag(
            fair.virtual.get(rank, 0.0), fair.finish.get(key), est_tokens, standing.weight
        )
        fair.floors = standing.floors  # (as the last joining call's configuration says)
        self.queue[call_id] = (now + claim_s, claim_s, score(rank, tagged))

    def first_live_waiter(self, now: float) -> tuple[str, float] | None:
        """The waiter served next (its class first, its fair-queuing tag within the
        class, `core.standing`), out of the queue, with its claim_s; a waiter it comes
        to whose claim has ended is dropped, and the next one is looked for."""
        fair = self.fair
        while self.queue:
            ranks = sorted({rank_of(place[2]) for place in self.queue.values()})
            rank = next_class(ranks, fair.counts, fair.floors) if fair.floors else ranks[0]
            call_id = min(
                (c for c, place in self.queue.items() if rank_of(place[2]) == rank),
                key=lambda c: self.queue[c][2],
            )
            claim_end, claim_s, served = self.queue.pop(call_id)
            if claim_end <= now:
                continue
            fair.virtual[rank] = served - rank * RANK_SPAN
            if fair.floors:
                fair.counts = served_counts(fair.counts, rank)
            return call_id, claim_s
        return None


@dataclass
class Gate:
    until: float
    reset: bool = False
    probe: str | None = None
    probe_until: float = -math.inf
    error: str | None = None


@dataclass
class QuotaState:
    request_tat: float = -math.inf
    token_tat: float = -math.inf
    admitted: deque[float] = field(default_factory=deque)  # the sliding window's log

    def in_window(self, now: float) -> deque[float]:
        while self.admitted and self.admitted[0] <= now - WINDOW_S:
            self.admitted.popleft()
        return self.admitted


@dataclass
class Ledger:
    """Everything the in-memory store keeps, and its release hub (which wakes callers)."""

    sources: dict[str, SourceState] = field(default_factory=dict)
    quotas: dict[str, QuotaState] = field(default_factory=dict)
    # A scope's last success, and (scope, class rank) its class's (SPEC §8).
    progress: dict[str | tuple[str, int], float] = field(default_factory=dict)
    gates: dict[str, Gate] = field(default_factory=dict)
    releases: ReleaseHub = field(default_factory=ReleaseHub)

    def source(self, terms: SourceTerms) -> SourceState:
        """The source's state, its AIMD limit set from its terms on first use."""
        state = self.sources.get(terms.name)  # (no new state built to be thrown away)
        if state is None:
            state = self.sources[terms.name] = SourceState()
        if state.aimd is None:
            state.aimd = aimd_initial(terms.aimd, terms.max_concurrency)
        return state

    def quota(self, name: str) -> QuotaState:
        state = self.quotas.get(name)
        if state is None:
            state = self.quotas[name] = QuotaState()
        return state

    @staticmethod
    def limit(state: SourceState, terms: SourceTerms) -> int:
        """Permits the source may hold at once now (its AIMD limit, within its cap)."""
        assert state.aimd is not None
        return aimd_permits(state.aimd, terms.max_concurrency)

    def hand_to_waiter(self, name: str, state: SourceState, now: float) -> str | None:
        """Hand a free permit of `name` to its first live waiter, if any: its call id
        (the caller wakes it)."""
        head = state.first_live_waiter(now)
        if head is None:
            return None
        call_id, claim_s = head
        state.handed[call_id] = now + claim_s
        return call_id

    def hand_on(self, name: str, state: SourceState, now: float) -> None:
        """A permit of `name` is free: hand it to the first live waiter and wake it, else
        wake a watch of a caller that does not queue."""
        call_id = self.hand_to_waiter(name, state, now)
        if call_id is None:
            self.releases.released(name)
        else:
            self.releases.wake_call(call_id, name)
