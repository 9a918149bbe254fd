"""Store layer: the in-memory store, for one process (tests, the embedded demo).

Every operation runs without suspending, so each is atomic on the event loop,
just as each Redis operation is one script. The store's clock is the `Clock`
it is given, so under a `VirtualClock` the whole store runs in virtual time.
Permits do not need leases here: a process that dies takes its store with it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from polygate_celery.clock import Clock, SystemClock
from polygate_celery.core.aimd import (
    AimdState,
    aimd_initial,
    aimd_on_congestion,
    aimd_on_success,
    aimd_permits,
)
from polygate_celery.core.breaker import (
    BreakerState,
    Effect,
    breaker_admit,
    breaker_reopens_at,
    breaker_settle,
)
from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.quota import (
    BOOKING_SLACK_S,
    LEARNED_TTL_S,
    WINDOW_KEPT_S,
    WINDOW_S,
    counts_in_windows,
    gcra_book,
    gcra_charge,
    gcra_reserve,
    gcra_settle,
    gcra_spent,
    learned_tat,
    requests_spent,
    window_charge,
    window_learn,
    window_take,
    window_wait,
)
from polygate_celery.core.terms import QuotaTerms, SourceTerms, follows_provider_windows
from polygate_celery.store.base import (
    AdmitRequest,
    BlockReason,
    Denial,
    Grant,
    QuotaSnapshot,
    Settlement,
    SourceSnapshot,
)
from polygate_celery.store.changes import (
    BreakerChange,
    SettleChanges,
    log_changes,
    log_half_open,
)
from polygate_celery.store.releases import ReleaseHub, Watch

# How long a gate that opened by time stays on record as its scope's stall (as gate.lua's
# key expiry): a later close within it is the same outage, and a success ends it.
GATE_KEPT_S = 60.0

PROGRESS_TTL_S = 3600.0

# The refusals that say something of the source's health: a refused call is told its
# last error (`Denial.errors`).
_HEALTH_BLOCKS: frozenset[BlockReason] = frozenset({"paused", "breaker_open", "probe_in_flight"})


@dataclass
class _Bucket:
    limit: int
    tat: float
    since: float  # learned since: a permit admitted before was not charged to it


@dataclass
class _Learned:
    """The limits a source's provider announced: "req" (rpm) and "tok" (tpm) buckets,
    and the provider's requests window (its end, what is left of it, and when an answer
    last showed that the provider counts in windows), forgotten `LEARNED_TTL_S` after the
    last announcement."""

    buckets: dict[str, _Bucket] = field(default_factory=dict)
    seen: float = -math.inf
    window_end: float = -math.inf
    window_left: float = 0.0
    window_seen: float = -math.inf

    def live(self, now: float) -> dict[str, _Bucket]:
        if now - self.seen > LEARNED_TTL_S:
            self.buckets.clear()
            self.window_end, self.window_left, self.window_seen = -math.inf, 0.0, -math.inf
        return self.buckets

    def in_windows(self, now: float, follow: bool) -> bool:
        """Whether requests follow the provider's window now (see `core.quota`)."""
        return follow and "req" in self.live(now) and now - self.window_seen <= WINDOW_KEPT_S

    def check(
        self, now: float, est_tokens: int, windows: bool, declared_rpm: int | None
    ) -> dict[str, float] | float:
        """New TATs (and the window's "end" and "left") if the announced limits admit,
        else seconds until they may. With `windows`, requests follow the provider's
        window, a `declared_rpm` lower than its limit holding back the difference."""
        tats: dict[str, float] = {}
        waits: list[float] = []
        buckets = self.live(now)
        for dimension, cost in (("req", 1), ("tok", est_tokens)):
            if dimension in buckets and cost > 0:
                bucket = buckets[dimension]
                if dimension == "req" and windows:
                    taken = window_take(
                        self.window_end, self.window_left, now, bucket.limit, declared_rpm
                    )
                    if isinstance(taken, float):
                        waits.append(taken)
                    else:
                        tats["end"], tats["left"] = taken
                    continue
                tats[dimension], wait = gcra_reserve(bucket.tat, now, cost, bucket.limit)
                if wait is not None:
                    waits.append(wait)
        if "req" in tats:  # counted as a bucket: the window is kept up to date
            tats["left"] = window_charge(self.window_end, self.window_left, now)
        return max(waits) if waits else tats

    def take(self, tats: dict[str, float]) -> None:
        """Record an admission `check` allowed."""
        for dimension, tat in tats.items():
            if dimension == "end":
                self.window_end = tat
            elif dimension == "left":
                self.window_left = tat
            else:
                self.buckets[dimension].tat = tat

    def settle_tokens(self, now: float, admitted_at: float, est: int, used: int) -> None:
        """Replace the estimate the bucket charged at admission by the use, if it did."""
        bucket = self.live(now).get("tok")
        if bucket is not None and est > 0 and admitted_at > bucket.since:
            bucket.tat = gcra_settle(bucket.tat, est, used, bucket.limit)

    def learn(self, now: float, limits: RateLimits) -> None:
        buckets = self.live(now)
        for dimension, limit, remaining in (
            ("req", limits.requests_limit, limits.requests_remaining),
            ("tok", limits.tokens_limit, limits.tokens_remaining),
        ):
            if limit is not None and limit > 0 and remaining is not None:
                bucket = buckets.setdefault(dimension, _Bucket(limit, -math.inf, now))
                bucket.limit = limit
                bucket.tat = learned_tat(bucket.tat, now, limit, remaining)
                self.seen = now
        shown = counts_in_windows(
            limits.requests_limit, limits.requests_remaining, limits.requests_reset_s
        )
        if shown is None:
            return
        assert limits.requests_remaining is not None
        assert limits.requests_reset_s is not None
        if shown:
            self.window_seen = now
        self.window_end, self.window_left = window_learn(
            self.window_end,
            self.window_left,
            now,
            limits.requests_remaining,
            limits.requests_reset_s,
        )


@dataclass
class _SourceState:
    aimd: AimdState | None = None  # set from the source's terms on first use
    breaker: BreakerState = field(default_factory=BreakerState)
    permits: set[str] = field(default_factory=set)
    paused_until: float = -math.inf
    learned: _Learned = field(default_factory=_Learned)
    # Waiting calls, first come first served: call id -> (end of its claim, claim_s);
    # and permits a release handed to one of them: call id -> end of its claim.
    queue: dict[str, tuple[float, float]] = field(default_factory=dict)
    handed: dict[str, float] = field(default_factory=dict)
    # Quota slots booked by waiting calls: call id -> [slot, end of its claim].
    booked: dict[str, list[float]] = field(default_factory=dict)
    # The source's last error (as settle.lua keeps it), and when its breaker last opened.
    error: str | None = None
    opened_at: float | None = None

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

    def first_live_waiter(self, now: float) -> tuple[str, float] | None:
        """The first waiter whose claim has not ended, out of the queue, with its claim_s."""
        while self.queue:
            call_id = next(iter(self.queue))
            claim_end, claim_s = self.queue.pop(call_id)
            if claim_end > now:
                return call_id, claim_s
        return None


@dataclass
class _Gate:
    until: float
    reset: bool = False
    probe: str | None = None
    probe_until: float = -math.inf
    error: str | None = None


@dataclass
class _QuotaState:
    request_tat: float = -math.inf
    token_tat: float = -math.inf
    admitted: deque[float] = field(default_factory=deque)  # the sliding window's log

    def in_window(self, now: float) -> deque[float]:
        while self.admitted and self.admitted[0] <= now - WINDOW_S:
            self.admitted.popleft()
        return self.admitted


@dataclass(frozen=True, slots=True)
class _Dim:
    """One quota bucket a booking charges: its TAT, the cost, the limit, where it is kept."""

    tat: float
    cost: float
    limit: int
    holder: object
    attribute: str

    def charge(self, tat: float) -> None:
        setattr(self.holder, self.attribute, tat)


def _bookable(terms: SourceTerms) -> bool:
    """Whether a refusal at `terms` for quota may be booked: buckets only (a sliding
    window's callers ask again when the window moves)."""
    return terms.quota is None or terms.quota.rpm is None or terms.quota.rpm_window != "sliding"


def _take_breaker(
    name: str, state: _SourceState, breaker: BreakerState, permit_id: str, now: float
) -> bool:
    """Keep the breaker's state after admitting `permit_id` at source `name`: whether the
    permit is its half-open probe (an admission that turned it half-open says so)."""
    probe = breaker.probe == permit_id and state.breaker.probe != permit_id
    if probe and state.breaker.mode == "open":
        opened = None if state.opened_at is None else now - state.opened_at
        log_half_open(name, opened, state.error)
    state.breaker = breaker
    return probe


class MemoryStore:
    """The store protocol on plain dictionaries, for a single process."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._sources: dict[str, _SourceState] = {}
        self._quotas: dict[str, _QuotaState] = {}
        self._progress: dict[str, float] = {}
        self._gates: dict[str, _Gate] = {}
        self._releases = ReleaseHub()

    def _source(self, terms: SourceTerms) -> _SourceState:
        state = self._sources.setdefault(terms.name, _SourceState())
        if state.aimd is None:
            state.aimd = aimd_initial(terms.aimd, terms.max_concurrency)
        return state

    def _limit(self, state: _SourceState, terms: SourceTerms) -> int:
        assert state.aimd is not None
        return aimd_permits(state.aimd, terms.max_concurrency)

    def _quota_check(
        self, quota: QuotaTerms, now: float, est_tokens: int, windows: bool
    ) -> tuple[float, float] | float:
        """New (request_tat, token_tat) if the quota admits, else seconds until it may.
        With `windows`, its rpm is the provider's window's to enforce (`_Learned.check`)."""
        state = self._quotas.setdefault(quota.name, _QuotaState())
        request_tat, token_tat = state.request_tat, state.token_tat
        waits: list[float] = []
        if quota.rpm is not None and quota.rpm_window == "sliding":
            wait = window_wait(state.in_window(now), now, quota.rpm)
            if wait is not None:
                waits.append(wait)
            request_tat = gcra_charge(request_tat, now, quota.rpm)  # for bucket readers
        elif quota.rpm is not None and windows:
            request_tat = gcra_charge(request_tat, now, quota.rpm)  # for bucket readers
        elif quota.rpm is not None:
            request_tat, wait = gcra_reserve(request_tat, now, 1, quota.rpm)
            if wait is not None:
                waits.append(wait)
        if quota.tpm is not None and est_tokens > 0:
            token_tat, wait = gcra_reserve(token_tat, now, est_tokens, quota.tpm)
            if wait is not None:
                waits.append(wait)
        return max(waits) if waits else (request_tat, token_tat)

    def _gated(self, request: AdmitRequest, now: float) -> Denial | None:
        """The gate's refusal of this call, if the scope's gate is closed to it."""
        gate = self._gates.get(request.scope)
        if gate is None or gate.until <= now:  # open; kept a while as the stall's record
            return None
        if gate.probe in (None, request.call_id) or gate.probe_until <= now:
            gate.probe, gate.probe_until = request.call_id, now + request.probe_lease_s
            return None
        return Denial(
            gate.until - now,
            (),
            gated_for_s=gate.until - now,
            gated_reset=gate.reset,
            gated_error=gate.error,
        )

    async def admit(self, request: AdmitRequest) -> Grant | Denial:
        now = self._clock.now()
        blocked: list[tuple[str, BlockReason]] = []
        errors: list[tuple[str, str]] = []
        reopen: list[float] = []
        for terms in request.candidates:  # a repeated admit returns its first grant
            if request.permit_id in self._source(terms).permits:
                return Grant(terms.name, request.permit_id, now)
        if request.gate and (refusal := self._gated(request, now)) is not None:
            return refusal
        waiter = request.call_id if request.claim_s > 0 and request.call_id else None
        bookable: list[tuple[SourceTerms, _SourceState]] = []
        booked: list[list[float]] = []  # the bookings this call holds
        for terms in request.candidates:
            state = self._source(terms)
            state.in_use(now)  # ends lapsed claims
            mine = waiter is not None and state.handed.pop(waiter, None) is not None
            booking = state.booking(waiter, now) if waiter is not None else None
            if booking is not None:
                booked.append(booking)
            reasons: list[BlockReason] = []
            known: list[float] = []
            breaker = self._source_reasons(
                terms, state, request.permit_id, now, reasons, known, errors
            )
            quota, learned = self._quota_reasons(
                terms, state, booking, request, now, reasons, known
            )
            if reasons:
                blocked.append((terms.name, reasons[0]))
                if known and len(known) == len(reasons):
                    reopen.append(max(known))
                if waiter is not None and not mine and reasons == ["at_capacity"]:
                    # joins the queue (or keeps its place) and renews its claim
                    state.queue[waiter] = (now + request.claim_s, request.claim_s)
                if booking is not None:  # kept while the call waits on
                    booking[1] = max(booking[1], now + request.claim_s)
                elif set(reasons) == {"quota"} and self._bookable(terms, state, now):
                    bookable.append((terms, state))
                continue
            assert breaker is not None
            probe = _take_breaker(terms.name, state, breaker, request.permit_id, now)
            if booking is not None:  # paid when booked
                state.permits.add(request.permit_id)
            else:
                assert isinstance(learned, dict)
                self._charge(terms, state, request.permit_id, learned, quota, now)
            if waiter is not None:  # out of every queue; a permit handed to it elsewhere moves on
                for other in request.candidates:
                    other_state = self._source(other)
                    other_state.queue.pop(waiter, None)
                    other_state.booked.pop(waiter, None)  # (one elsewhere lapses unused)
                    if other_state.handed.pop(waiter, None) is not None:
                        self._hand_on(other.name, other_state, now)
            return Grant(terms.name, request.permit_id, now, probe=probe)
        ahead = [b[0] - now for b in booked if b[0] > now + BOOKING_SLACK_S]
        booked_in_s = min(ahead) if ahead else None
        if waiter is not None and bookable and not booked and request.book_within_s > 0:
            booked_in_s = self._book(bookable, waiter, request, now)
            if booked_in_s is not None:
                reopen.append(booked_in_s)
        return Denial(
            reopen_in_s=min(reopen) if reopen else None,
            blocked=tuple(blocked),
            booked_in_s=booked_in_s,
            errors=tuple(errors),
        )

    def _source_reasons(
        self,
        terms: SourceTerms,
        state: _SourceState,
        permit_id: str,
        now: float,
        reasons: list[BlockReason],
        known: list[float],
        errors: list[tuple[str, str]],
    ) -> BreakerState | None:
        """The pause's, the breaker's and the cap's say (as `_quota_reasons`; the source's
        last error goes into `errors` where its pause or breaker refuses): the breaker's
        state if it admits."""
        if state.paused_until > now:
            reasons.append("paused")
            known.append(state.paused_until - now)
        breaker = breaker_admit(state.breaker, now, permit_id)
        if breaker is None:
            opens = breaker_reopens_at(state.breaker, now)
            reasons.append("breaker_open" if opens is not None else "probe_in_flight")
            if opens is not None:
                known.append(opens - now)
        if state.error is not None and not _HEALTH_BLOCKS.isdisjoint(reasons):
            errors.append((terms.name, state.error))
        if state.in_use(now) >= self._limit(state, terms):
            reasons.append("at_capacity")
        return breaker

    def _quota_reasons(
        self,
        terms: SourceTerms,
        state: _SourceState,
        booking: list[float] | None,
        request: AdmitRequest,
        now: float,
        reasons: list[BlockReason],
        known: list[float],
    ) -> tuple[tuple[float, float] | float | None, dict[str, float] | float]:
        """The declared and learned quotas' say (a refusal goes into `reasons` and `known`):
        what admitting would charge them, or nothing for a call whose slot is booked."""
        if booking is not None:  # its quota is paid: it may run from its slot on
            if now + BOOKING_SLACK_S < booking[0]:
                reasons.append("quota")
                known.append(booking[0] - now)
            return None, {}
        quota = None
        windows = state.learned.in_windows(now, follows_provider_windows(terms.quota))
        if terms.quota is not None:
            quota = self._quota_check(terms.quota, now, request.est_tokens, windows)
            if isinstance(quota, float):
                reasons.append("quota")
                known.append(quota)
        declared_rpm = terms.quota.rpm if terms.quota is not None else None
        learned = state.learned.check(now, request.est_tokens, windows, declared_rpm)
        if isinstance(learned, float):
            reasons.append("quota")
            known.append(learned)
        return quota, learned

    def _bookable(self, terms: SourceTerms, state: _SourceState, now: float) -> bool:
        """Whether a refusal at `terms` for quota may be booked: buckets only (a sliding
        window's callers, and those of a provider's window, ask again when it moves)."""
        return _bookable(terms) and not state.learned.in_windows(
            now, follows_provider_windows(terms.quota)
        )

    def _book(
        self,
        bookable: list[tuple[SourceTerms, _SourceState]],
        call_id: str,
        request: AdmitRequest,
        now: float,
    ) -> float | None:
        """Book the soonest slot the quotas of one candidate give, if soon enough."""
        best: tuple[float, list[float], list[_Dim], _SourceState] | None = None
        for terms, state in bookable:
            dims = self._dims(terms, state, request.est_tokens, now)
            slot, tats = gcra_book([(d.tat, d.cost, d.limit) for d in dims], now)
            if best is None or slot < best[0]:
                best = (slot, tats, dims, state)
        assert best is not None
        slot, tats, dims, state = best
        if slot - now > request.book_within_s:
            return None
        for dim, tat in zip(dims, tats, strict=True):
            dim.charge(tat)
        state.booked[call_id] = [slot, slot + request.claim_s]
        return slot - now

    def _dims(
        self, terms: SourceTerms, state: _SourceState, est_tokens: int, now: float
    ) -> list[_Dim]:
        """The quota buckets an admission at `terms` is charged to."""
        dims: list[_Dim] = []
        quota = terms.quota
        if quota is not None:
            qs = self._quotas.setdefault(quota.name, _QuotaState())
            if quota.rpm is not None:
                dims.append(_Dim(qs.request_tat, 1, quota.rpm, qs, "request_tat"))
            if quota.tpm is not None and est_tokens > 0:
                dims.append(_Dim(qs.token_tat, est_tokens, quota.tpm, qs, "token_tat"))
        # (a caller refused by a provider's window is not bookable: see `_bookable`)
        for dimension, bucket in state.learned.live(now).items():
            cost = 1 if dimension == "req" else est_tokens
            if cost > 0:
                dims.append(_Dim(bucket.tat, cost, bucket.limit, bucket, "tat"))
        return dims

    def _charge(
        self,
        terms: SourceTerms,
        state: _SourceState,
        permit_id: str,
        learned: dict[str, float],
        quota: tuple[float, float] | float | None,
        now: float,
    ) -> None:
        """Record an admission: the permit, the learned and declared quotas' charges."""
        state.permits.add(permit_id)
        state.learned.take(learned)
        if terms.quota is not None and isinstance(quota, tuple):
            quota_state = self._quotas[terms.quota.name]
            quota_state.request_tat, quota_state.token_tat = quota
            if terms.quota.rpm is not None and terms.quota.rpm_window == "sliding":
                quota_state.admitted.append(now)

    async def settle(self, settlement: Settlement) -> bool:
        state = self._source(settlement.source)
        before, paused_until = state.breaker, state.paused_until
        gate = self._gates.get(settlement.scope)
        had_gate = gate is not None and gate.until + GATE_KEPT_S > self._clock.now()
        held = self._settle(settlement)
        now = self._clock.now()
        after = state.breaker
        pause = settlement.pause_s
        change: BreakerChange | None = None
        if after.mode == "open" and before.mode != "open":
            change = "opened" if before.mode == "closed" else "reopened"
        elif after.mode == "closed" and before.mode != "closed":
            change = "closed"
        changes = SettleChanges(
            breaker=change,
            open_for_s=after.open_until - now if change in ("opened", "reopened") else 0.0,
            paused_for_s=pause if pause is not None and pause > 0 and paused_until <= now else None,
            gate_opened=had_gate and settlement.scope not in self._gates,
        )
        if change in ("opened", "reopened"):
            state.opened_at = now
        if changes != SettleChanges():
            log_changes(settlement, changes)
        return held

    def _settle(self, settlement: Settlement) -> bool:
        now = self._clock.now()
        terms = settlement.source
        state = self._source(terms)
        # Facts safe to record twice are kept even for a permit no longer held (its
        # lease lapsed while the answer came): the pause, the announcements, and what a
        # success shows (the source serves: breaker closed, AIMD increase, progress).
        # A failure's breaker count and AIMD decrease, and the token settlement, belong
        # to the permit's own accounting.
        paused = settlement.pause_s is not None and settlement.pause_s > 0
        if paused:
            assert settlement.pause_s is not None
            state.paused_until = max(state.paused_until, now + settlement.pause_s)
        held = settlement.permit_id in state.permits
        # The source's last error (as settle.lua keeps it): what it said as a pause began,
        # or a held permit's failure; a success while no pause runs ends it.
        failed = held and settlement.effect in (Effect.FAILURE, Effect.AUTH_FAILURE)
        if settlement.error and (paused or failed):
            state.error = settlement.error
        elif settlement.effect is Effect.SUCCESS and state.paused_until <= now:
            state.error = None
        if held:  # the estimate first, then the announcement (a floor on what is spent)
            state.learned.settle_tokens(
                now, settlement.admitted_at, settlement.est_tokens, settlement.used_tokens
            )
        if settlement.limits is not None:
            state.learned.learn(now, settlement.limits)
        if settlement.effect is Effect.SUCCESS:
            self._progress[settlement.scope] = now
            self._gates.pop(settlement.scope, None)  # the scope is alive: open its gate
        if not held and settlement.effect is not Effect.SUCCESS:
            return False
        state.breaker = breaker_settle(
            state.breaker, terms.breaker, now, settlement.permit_id, settlement.effect
        )
        assert state.aimd is not None
        if settlement.effect is Effect.SUCCESS:
            state.aimd = aimd_on_success(state.aimd, terms.aimd, terms.max_concurrency)
            if not held:
                return False
        elif settlement.congested:
            state.aimd = aimd_on_congestion(state.aimd, terms.aimd, settlement.admitted_at, now)
        state.permits.discard(settlement.permit_id)
        quota = terms.quota
        if quota is not None and quota.tpm is not None and settlement.est_tokens > 0:
            quota_state = self._quotas.setdefault(quota.name, _QuotaState())
            quota_state.token_tat = gcra_settle(
                quota_state.token_tat, settlement.est_tokens, settlement.used_tokens, quota.tpm
            )
        breaker = state.breaker
        runnable = breaker.mode != "open" and breaker.probe is None and state.paused_until <= now
        if runnable and state.in_use(now) < self._limit(state, terms):
            self._hand_on(terms.name, state, now)
        return True

    def _hand_on(self, name: str, state: _SourceState, now: float) -> None:
        """A permit of `name` is free: hand it to the first live waiter, else wake a watch
        of a caller that does not queue."""
        if not self._hand_to_waiter(name, state, now):
            self._releases.released(name)

    def _hand_to_waiter(self, name: str, state: _SourceState, now: float) -> bool:
        """Hand a free permit of `name` to its first live waiter, if any."""
        head = state.first_live_waiter(now)
        if head is None:
            return False
        call_id, claim_s = head
        state.handed[call_id] = now + claim_s
        self._releases.wake_call(call_id, name)
        return True

    async def progress_age_s(self, scope: str) -> float:
        marked = self._progress.get(scope)
        if marked is None:
            return math.inf
        age = self._clock.now() - marked
        return math.inf if age >= PROGRESS_TTL_S else max(0.0, age)

    async def mark_progress(self, scope: str) -> None:
        """Record a success in `scope` now, as another worker's call would."""
        self._progress[scope] = self._clock.now()

    async def close_gate(
        self,
        scope: str,
        seconds: float,
        reset: bool = False,
        call_id: str = "",
        error: str | None = None,
    ) -> bool:
        now = self._clock.now()
        gate = self._gates.get(scope)
        if gate is not None and gate.until + GATE_KEPT_S <= now:
            gate = None  # as the gate's Redis key expires
        said = error or (gate.error if gate is not None else None)
        if gate is None or gate.until <= now:  # it was open: no probe yet
            self._gates[scope] = _Gate(now + seconds, reset, error=said)
            return gate is None
        if call_id and gate.probe == call_id:  # the probe's own verdict: its slot is free
            gate.probe, gate.probe_until = None, -math.inf
        if gate.until <= now + seconds:  # the later close is kept
            gate.until, gate.reset = now + seconds, reset
        gate.error = said
        return False

    async def pause_source(self, source: str, seconds: float) -> None:
        state = self._sources.setdefault(source, _SourceState())
        state.paused_until = max(state.paused_until, self._clock.now() + seconds)

    async def resume_source(self, source: str) -> None:
        state = self._sources.get(source)
        if state is not None:
            state.paused_until = -math.inf

    async def reset_source(self, source: str) -> None:
        state = self._sources.get(source)
        if state is not None:
            state.breaker = BreakerState()
            state.aimd = None  # back to the initial limit on next use, from the terms
            state.paused_until = -math.inf
            state.error = state.opened_at = None

    async def gate_closed_for_s(self, scope: str) -> float:
        gate = self._gates.get(scope)
        return max(0.0, gate.until - self._clock.now()) if gate is not None else 0.0

    async def quota_snapshot(self, quota: QuotaTerms) -> QuotaSnapshot:
        now = self._clock.now()
        state = self._quotas.get(quota.name, _QuotaState())
        in_window = len(state.in_window(now))
        return QuotaSnapshot(
            name=quota.name,
            requests_used=requests_spent(
                quota.rpm, quota.rpm_window, in_window, state.request_tat, now
            ),
            tokens_used=None if quota.tpm is None else gcra_spent(state.token_tat, now, quota.tpm),
        )

    def watch_releases(self, sources: Sequence[str], call_id: str = "") -> Watch:
        return self._releases.watch(sources, call_id)

    async def keep_places(self, places: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        now = self._clock.now()
        kept: list[bool] = []
        full_only: dict[str, tuple[SourceTerms, _SourceState]] = {}
        for terms, call_id, claim_s in places:
            state = self._source(terms)
            breaker = state.breaker
            merely_full = (
                breaker.mode == "closed" and breaker.probe is None and state.paused_until <= now
            )
            place = state.queue.get(call_id) if merely_full else None
            if place is not None:  # (still there: not passed over, even if its claim ran out)
                state.queue[call_id] = (max(place[0], now + claim_s), claim_s)  # (order kept)
            kept.append(place is not None)
            if merely_full:
                full_only[terms.name] = (terms, state)
        for name, (terms, state) in full_only.items():
            while state.in_use(now) < self._limit(state, terms):
                if not self._hand_to_waiter(name, state, now):
                    break
        return kept

    async def renew(self, leases: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        """Permits here carry no lease (one is held until settled): report which are held."""
        return [permit_id in self._source(source).permits for source, permit_id, _ in leases]

    async def aclose(self) -> None:
        """Nothing to close: the state lives in this process's memory."""

    async def snapshot(self, source: SourceTerms) -> SourceSnapshot:
        state = self._source(source)
        learned = state.learned.live(self._clock.now())
        return SourceSnapshot(
            name=source.name,
            permits_in_use=len(state.permits),
            permit_limit=self._limit(state, source),
            breaker=state.breaker.mode,
            breaker_failures=state.breaker.failures,
            paused_for_s=max(0.0, state.paused_until - self._clock.now()),
            learned_rpm=learned["req"].limit if "req" in learned else None,
            learned_tpm=learned["tok"].limit if "tok" in learned else None,
        )
