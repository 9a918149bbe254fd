"""Store layer (memory): an admission's quotas, declared and learned, as admit.lua's.

What a candidate's quotas say of an admission (`quota_say`: the waits of those
that refuse it, else what admitting charges them), the charge itself, and the
booking of a quota's slot by a caller refused by quota buckets alone
(`core.quota.gcra_book`, see `AdmitRequest.book_within_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polygate_celery.core.quota import (
    BOOKING_SLACK_S,
    charge_s,
    gcra_book,
    gcra_charge,
    gcra_reserve,
    window_wait,
)
from polygate_celery.core.standing import (
    PLAIN,
    arrival_at,
    quota_tag,
    slot_goes_to,
    takes_later,
)
from polygate_celery.core.terms import QuotaTerms, SourceTerms, follows_provider_windows
from polygate_celery.store.base import AdmitRequest
from polygate_celery.store.memory.state import NO_TAG, Ledger, QuotaState, SourceState


@dataclass(frozen=True, slots=True)
class QuotaSay:
    """What a candidate's quotas say: seconds until each that refuses may admit (one
    ``"quota"`` reason each); else the new ``(request_tat, token_tat)`` of its declared
    quota (None if it has none, or its slot is booked) and of its learned limits."""

    waits: tuple[float, ...] = ()
    declared: tuple[float, float] | None = None
    learned: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Dim:
    """One quota bucket a booking charges: its TAT, the cost, the limit, where it is kept,
    and whether it counts tokens."""

    tat: float
    cost: float
    limit: int
    holder: object
    attribute: str
    tokens: bool = False

    def charge(self, tat: float) -> None:
        setattr(self.holder, self.attribute, tat)

    def later_s(self, booked: float, est: float) -> float:
        """How much later than a slot booked for `booked` units the bucket has room for
        `est` (0 for no more)."""
        return max(0.0, charge_s(est, self.limit) - charge_s(booked, self.limit))


def quota_say(
    ledger: Ledger,
    terms: SourceTerms,
    state: SourceState,
    booking: list[float] | None,
    est_tokens: int,
    now: float,
) -> QuotaSay:
    """The declared and learned quotas' say of an admission at `terms`; nothing is
    charged for a call whose slot is booked (its quota is paid: it may run from its slot
    on)."""
    if booking is not None:
        return QuotaSay((booking[0] - now,)) if now + BOOKING_SLACK_S < booking[0] else QuotaSay()
    waits: list[float] = []
    declared = None
    windows = state.learned.in_windows(now, follows_provider_windows(terms.quota))
    if terms.quota is not None:
        checked = _declared(ledger.quota(terms.quota.name), terms.quota, now, est_tokens, windows)
        if isinstance(checked, float):
            waits.append(checked)
        else:
            declared = checked
    declared_rpm = terms.quota.rpm if terms.quota is not None else None
    learned = state.learned.check(now, est_tokens, windows, declared_rpm)
    if isinstance(learned, float):
        return QuotaSay((*waits, learned), declared)
    return QuotaSay(tuple(waits), declared, learned)


def _declared(
    state: QuotaState, quota: QuotaTerms, now: float, est_tokens: int, windows: bool
) -> tuple[float, float] | float:
    """New (request_tat, token_tat) if the quota admits, else seconds until it may.
    With `windows`, its rpm is the provider's window's to enforce (`Learned.check`)."""
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


def charge(
    ledger: Ledger,
    terms: SourceTerms,
    state: SourceState,
    permit_id: str,
    say: QuotaSay,
    now: float,
) -> None:
    """Record an admission: the permit, the learned and declared quotas' charges."""
    state.permits.add(permit_id)
    state.learned.take(say.learned)
    if terms.quota is not None and say.declared is not None:
        quota_state = ledger.quota(terms.quota.name)
        quota_state.request_tat, quota_state.token_tat = say.declared
        if terms.quota.rpm is not None and terms.quota.rpm_window == "sliding":
            quota_state.admitted.append(now)


def bookable(terms: SourceTerms, state: SourceState, now: float) -> bool:
    """Whether a refusal at `terms` for quota may be booked: buckets only (a sliding
    window's callers, and those of a provider's window, ask again when it moves)."""
    quota = terms.quota
    sliding = quota is not None and quota.rpm is not None and quota.rpm_window == "sliding"
    return not sliding and not state.learned.in_windows(now, follows_provider_windows(quota))


def book(
    ledger: Ledger,
    candidates: list[tuple[SourceTerms, SourceState]],
    call_id: str,
    request: AdmitRequest,
    now: float,
) -> list[float] | None:
    """Book the soonest slot the quotas of one candidate give, if soon enough: the booking
    (`SourceState.booked`'s entry). A sooner slot a lower class, or a call of the caller's
    class it comes before, booked is taken instead (`take_booked`)."""
    best: tuple[float, list[float], list[_Dim], SourceState] | None = None
    for terms, state in candidates:
        dims = _dims(ledger, terms, state, request.est_tokens, now)
        slot, tats = gcra_book([(d.tat, d.cost, d.limit) for d in dims], now)
        if best is None or slot < best[0]:
            best = (slot, tats, dims, state)
    assert best is not None
    slot, tats, dims, state = best
    if request.standing is not PLAIN or request.arrival is not None:
        taken = take_booked(ledger, candidates, call_id, request, slot, now)
        if taken is not None:
            return taken
    if slot - now > request.book_within_s:
        return None
    for dim, tat in zip(dims, tats, strict=True):
        dim.charge(tat)
    return _booked(state, call_id, request, slot, now)


def _tag_at(state: SourceState, request: AdmitRequest) -> float | None:
    """The caller's fair-queuing tag on `state`'s quota: the one it was given, or, for a
    call of a tenant booking first, its tenant's next (`core.standing.quota_tag`)."""
    standing = request.standing
    if request.tag is not None or not standing.tenant:
        return request.tag
    fair, rank = state.quota_fair, standing.rank
    finish = fair.finish.get((rank, standing.tenant))
    return quota_tag(fair.virtual.get(rank, 0.0), finish, request.est_tokens, standing.weight)


def _booked(
    state: SourceState, call_id: str, request: AdmitRequest, slot: float, now: float
) -> list[float]:
    """The caller's booking of `slot` at `state`, kept in `SourceState.booked`; a tenant's
    first booking there gives its tenant's next tag."""
    rank, est = float(request.standing.rank), float(request.est_tokens)
    arrival = arrival_at(now) if request.arrival is None else request.arrival
    tag_ = _tag_at(state, request)
    if tag_ is not None and request.tag is None:
        state.quota_fair.finish[request.standing.rank, request.standing.tenant] = tag_
    booking = [slot, slot + request.claim_s, rank, est, float(arrival)]
    booking.append(NO_TAG if tag_ is None else tag_)
    state.booked[call_id] = booking
    return booking


TAKE_SCAN = 32  # the soonest bookings ahead looked at, per candidate (as admit_booking.lua)


def take_booked(
    ledger: Ledger,
    candidates: list[tuple[SourceTerms, SourceState]],
    call_id: str,
    request: AdmitRequest,
    fresh_slot: float,
    now: float,
) -> list[float] | None:
    """A booking ahead that the caller comes before, at one of `candidates`: a waiter's of
    a class the caller's is served before, or of a call of the caller's class it comes
    before (a later one, or, between tenants' calls, one of a higher tag:
    `core.standing.takes_later`), whose slot is no later than a new booking's
    (`fresh_slot`) and within `book_within_s` (SPEC §8). Another class's booking comes
    before one of the caller's own class, if either is soon enough.

    On the source's own buckets (declared for it alone, or learned), every booking charged
    to them is in its `SourceState.booked`: the caller goes in at that slot (later by the
    difference if its tokens are more than the booker's: the bucket has room there for
    the booker's), charged as for a new booking, and that booking and every one after it
    move later by the caller's charge; their bookers are told when they ask. On a quota
    shared with other sources (a ``[quotas]`` entry), whose bookings are not moved from
    here, it takes the slot instead, when it has room for its tokens, the buckets charged
    already for the booker's; the booker finds its booking gone when it asks, and books
    anew.

    Looks at the `TAKE_SCAN` soonest bookings ahead of each candidate; of two classes, a
    slot goes to one owed a slot there, else to the higher (`core.standing.slot_goes_to`);
    a `PLAIN` caller comes before a later call only. The caller's booking, or None (as
    admit_booking.lua's `take_booked`)."""
    rank = request.standing.rank
    # another class's booking (or, on its own buckets, the one it goes in before), and one
    # of a call of the caller's own class: (the caller's slot there, candidate, its
    # state, the booker)
    bests: list[tuple[float, SourceTerms, SourceState, str] | None] = [None, None]
    for terms, state in candidates:
        tag_ = _tag_at(state, request)
        dims = _dims(ledger, terms, state, request.est_tokens, now)
        tokens = [d for d in dims if d.tokens]
        own = _own(terms) or not any(isinstance(d.holder, QuotaState) for d in dims)

        ahead = sorted(
            (booking[1], other)
            for other, booking in state.booked.items()
            if booking[1] > now + request.claim_s
        )
        if own:  # walking back: before the earliest of the last bookings it comes before
            at = None
            for _, other in reversed(ahead[-TAKE_SCAN:]):
                if not _comes_before(request, state, tag_, state.booked[other]):
                    break
                if state.booked[other][0] > now:
                    at = other
            if at is not None:
                slot = state.booked[at][0] + _later_than(tokens, state.booked[at], request)
                if bests[0] is None or slot < bests[0][0]:
                    bests[0] = (slot, terms, state, at)
            continue
        for _, other in ahead[:TAKE_SCAN]:  # the soonest it comes before, to take its slot
            booking = state.booked[other]
            slot, theirs = booking[0], int(booking[2])
            which = int(theirs == rank)
            best = bests[which]
            if slot <= now or (best is not None and slot >= best[0]):
                continue
            if _later_than(tokens, booking, request) > 0:
                continue  # the bucket has room there for the booker's tokens alone
            if not _comes_before(request, state, tag_, booking):
                continue  # one that comes before it
            bests[which] = (slot, terms, state, other)
    # Another class's first (the classes' order and floors come before the order within
    # one), if soon enough: no later than a new booking, and within `book_within_s`.
    soon = [
        b
        for b in bests
        if b is not None and b[0] - now <= request.book_within_s and b[0] <= fresh_slot
    ]
    if not soon:
        return None
    slot, terms, state, other = soon[0]
    dims = _dims(ledger, terms, state, request.est_tokens, now)
    if _own(terms) or not any(isinstance(d.holder, QuotaState) for d in dims):
        # it goes in before that booking: it and every one after it move later
        booked_at = state.booked[other][0]
        by = max(charge_s(d.cost, d.limit) for d in dims)
        for booking in state.booked.values():
            if booking[0] >= booked_at:
                booking[0] += by
                booking[1] += by
        for dim in dims:
            dim.charge(dim.tat + charge_s(dim.cost, dim.limit))
    else:  # a shared quota: it takes the slot, charged already for the booker's tokens
        del state.booked[other]
    return _booked(state, call_id, request, slot, now)


def _comes_before(
    request: AdmitRequest, state: SourceState, tag_: float | None, booking: list[float]
) -> bool:
    """Whether the caller (its tag at `state`, `tag_`) comes before `booking`: another
    class's when its own is served first there; one of its class when that arrived later,
    or, between calls of tenants, is tagged after it (`core.standing.takes_later`)."""
    rank, theirs = request.standing.rank, int(booking[2])
    if theirs != rank:
        if request.standing is PLAIN:
            return False
        return slot_goes_to(rank, theirs, state.slot_credits, request.standing.floors) == rank
    booker_tag = None if booking[5] == NO_TAG else booking[5]
    return takes_later(request.arrival, rank, int(booking[4]), theirs, tag_, booker_tag)


def _later_than(tokens: list[_Dim], booking: list[float], request: AdmitRequest) -> float:
    """How much later than `booking`'s slot its token buckets have room for the caller's."""
    return max((d.later_s(booking[3], request.est_tokens) for d in tokens), default=0.0)


def _own(terms: SourceTerms) -> bool:
    """Whether `terms`'s declared quota is the source's own (not shared with others)."""
    return terms.quota is not None and terms.quota.name == f"source:{terms.name}"


def _dims(
    ledger: Ledger, terms: SourceTerms, state: SourceState, est_tokens: int, now: float
) -> list[_Dim]:
    """The quota buckets an admission at `terms` is charged to."""
    dims: list[_Dim] = []
    quota = terms.quota
    if quota is not None:
        qs = ledger.quota(quota.name)
        if quota.rpm is not None:
            dims.append(_Dim(qs.request_tat, 1, quota.rpm, qs, "request_tat"))
        if quota.tpm is not None and est_tokens > 0:
            dims.append(_Dim(qs.token_tat, est_tokens, quota.tpm, qs, "token_tat", True))
    # (a caller refused by a provider's window is not bookable: see `bookable`)
    for dimension, bucket in state.learned.live(now).items():
        cost = 1 if dimension == "req" else est_tokens
        if cost > 0:
            dims.append(_Dim(bucket.tat, cost, bucket.limit, bucket, "tat", dimension != "req"))
    return dims
