"""Store layer (memory): the in-memory store, for one process (tests, the embedded demo).

Every operation runs without suspending, so each is atomic on the event loop,
just as each Redis operation is one script. The store's clock is the `Clock`
it is given, so under a `VirtualClock` the whole store runs in virtual time.
Permits do not need leases here: a process that dies takes its store with it.
An admission (`admit`) and a settle (`settle`) are decided in their own modules;
here are the protocol's other operations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from polygate_celery.clock import Clock, SystemClock
from polygate_celery.core.breaker import BreakerState
from polygate_celery.core.quota import gcra_spent, requests_spent
from polygate_celery.core.standing import per_class, per_rank, rank_of
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store import base
from polygate_celery.store.admit import carry_out
from polygate_celery.store.memory.admit import admit as decide_admit
from polygate_celery.store.memory.settle import settle as record_settle
from polygate_celery.store.memory.state import (
    Gate,
    Ledger,
    QuotaState,
    SourceState,
)
from polygate_celery.store.releases import Watch


class MemoryStore:
    """The store protocol on plain dictionaries, for a single process."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._ledger = Ledger()

    async def admit(self, request: base.AdmitRequest) -> base.Grant | base.Denial:
        result = decide_admit(self._ledger, request, self._clock.now())
        return carry_out(result, self._ledger.releases)

    async def settle(self, settlement: base.Settlement) -> bool:
        return record_settle(self._ledger, settlement, self._clock)

    # (a subclass that plays a store with leases reaches a source's permits through these)
    @property
    def _sources(self) -> dict[str, SourceState]:
        return self._ledger.sources

    def _source(self, terms: SourceTerms) -> SourceState:
        return self._ledger.source(terms)

    async def progress_age_s(self, scope: str, rank: int | None = None) -> float:
        marked = self._ledger.progress.get(scope if rank is None else (scope, rank))
        if marked is None:
            return math.inf
        age = self._clock.now() - marked
        return math.inf if age >= base.PROGRESS_TTL_S else max(0.0, age)

    async def mark_progress(self, scope: str, rank: int | None = None) -> None:
        """Record a success in `scope` now, as another worker's call would."""
        now = self._ledger.progress[scope] = self._clock.now()
        if rank is not None:
            self._ledger.progress[scope, rank] = now

    async def close_gate(
        self,
        scope: str,
        seconds: float,
        reset: bool = False,
        call_id: str = "",
        error: str | None = None,
    ) -> bool:
        now = self._clock.now()
        gate = self._ledger.gates.get(scope)
        if gate is not None and gate.until + base.GATE_KEPT_S <= now:
            gate = None  # as the gate's Redis key expires
        said = error or (gate.error if gate is not None else None)
        if gate is None or gate.until <= now:  # it was open: no probe yet
            self._ledger.gates[scope] = Gate(now + seconds, reset, error=said)
            return gate is None
        if call_id and gate.probe == call_id:  # the probe's own verdict: its slot is free
            gate.probe, gate.probe_until = None, -math.inf
        if gate.until <= now + seconds:  # the later close is kept
            gate.until, gate.reset = now + seconds, reset
        gate.error = said
        return False

    async def pause_source(self, source: str, seconds: float) -> None:
        state = self._ledger.sources.setdefault(source, SourceState())
        state.paused_until = max(state.paused_until, self._clock.now() + seconds)

    async def resume_source(self, source: str) -> None:
        state = self._ledger.sources.get(source)
        if state is not None:
            state.paused_until = -math.inf

    async def reset_source(self, source: str) -> None:
        state = self._ledger.sources.get(source)
        if state is not None:
            state.breaker = BreakerState()
            state.aimd = None  # back to the initial limit on next use, from the terms
            state.paused_until = -math.inf
            state.error = state.opened_at = None

    async def gate_closed_for_s(self, scope: str) -> float:
        gate = self._ledger.gates.get(scope)
        return max(0.0, gate.until - self._clock.now()) if gate is not None else 0.0

    async def quota_snapshot(self, quota: QuotaTerms) -> base.QuotaSnapshot:
        now = self._clock.now()
        state = self._ledger.quotas.get(quota.name, QuotaState())
        in_window = len(state.in_window(now))
        return base.QuotaSnapshot(
            name=quota.name,
            requests_used=requests_spent(
                quota.rpm, quota.rpm_window, in_window, state.request_tat, now
            ),
            tokens_used=None if quota.tpm is None else gcra_spent(state.token_tat, now, quota.tpm),
        )

    def watch_releases(self, sources: Sequence[str], call_id: str = "") -> Watch:
        return self._ledger.releases.watch(sources, call_id)

    async def keep_places(self, places: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        now = self._clock.now()
        kept: list[bool] = []
        full_only: dict[str, tuple[SourceTerms, SourceState]] = {}
        for terms, call_id, claim_s in places:
            state = self._ledger.source(terms)
            breaker = state.breaker
            merely_full = (
                breaker.mode == "closed" and breaker.probe is None and state.paused_until <= now
            )
            place = state.queue.get(call_id) if merely_full else None
            if place is not None:  # (still there: not passed over, even if its claim ran out)
                state.queue[call_id] = (
                    max(place[0], now + claim_s),
                    claim_s,
                    place[2],
                )  # (order kept)
            kept.append(place is not None)
            if merely_full:
                full_only[terms.name] = (terms, state)
        for name, (terms, state) in full_only.items():
            while state.in_use(now) < self._ledger.limit(state, terms):
                handed = self._ledger.hand_to_waiter(name, state, now)
                if handed is None:
                    break
                self._ledger.releases.wake_call(handed, name)
        return kept

    async def renew(self, leases: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        """Permits here carry no lease (one is held until settled): report which are held."""
        return [permit_id in self._ledger.source(source).permits for source, permit_id, _ in leases]

    async def aclose(self) -> None:
        """Nothing to close: the state lives in this process's memory."""

    async def snapshot(self, source: SourceTerms) -> base.SourceSnapshot:
        state = self._ledger.source(source)
        now = self._clock.now()
        learned = state.learned.live(now)
        return base.SourceSnapshot(
            name=source.name,
            permits_in_use=len(state.permits),
            permit_limit=self._ledger.limit(state, source),
            breaker=state.breaker.mode,
            breaker_failures=state.breaker.failures,
            paused_for_s=max(0.0, state.paused_until - now),
            learned_rpm=learned["req"].limit if "req" in learned else None,
            learned_tpm=learned["tok"].limit if "tok" in learned else None,
            waiting=per_class(rank_of(place[2]) for place in state.queue.values()),
            recent_grants=per_rank(state.fair.counts),
            booked=per_class(
                int(booking[2]) for booking in state.booked.values() if booking[1] > now
            ),
            tenants=base.tenants_of(
                state.permits, state.queue, (c for c, b in state.booked.items() if b[1] > now)
            ),
        )
