"""Store layer (memory): an admission's quotas, declared and learned, as admit.lua's.

What a candidate's quotas say of an admission (`quota_say`: the waits of those
that refuse it, else what admitting charges them), the charge itself, and the
booking of a quota's slot by a caller refused by quota buckets alone
(`core.quota.gcra_book`, see `AdmitRequest.book_within_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polygate_celery.core.quota import (
    ARRIVAL_MARGIN_S,
    BOOKING_SLACK_S,
    charge_s,
    gcra_book,
    gcra_charge,
    gcra_reserve,
    gcra_settle,
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
        return max(0.0, gcra_settle(0.0, booked, est, self.limit))


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
    """A slot ahead that a waiter of a class the caller's is served before booked at one
    of `candidates`, or a call of the caller's class it comes before (a later one, or,
    between tenants' calls, one of a higher tag: `core.standing.takes_later`), no later
    than a new booking's (`fresh_slot`) and within `book_within_s`: taken for the caller
    (SPEC §8), its quota paid already (the token buckets charged for the caller's
    estimate instead of the booker's). The waiter it was taken from finds its booking
    gone when it asks at its slot, and books anew. Another class's slot is taken before
    one of the caller's own class, if either is soon enough.

    On a quota of tokens, the bucket has room at a slot for its booker's tokens: a caller
    of a larger estimate taking it is admitted later by the difference, and every booking
    after the slot moves as much later (they were placed after the booker's tokens; their
    bookers find out when they ask). On a quota shared with other sources (a
    ``[quotas]`` entry), whose bookings are not moved from here, such a slot is not taken.

    Looks at the `TAKE_SCAN` soonest bookings ahead of each candidate; of two classes, a
    slot goes to one owed a slot there, else to the higher (`core.standing.slot_goes_to`);
    a `PLAIN` caller takes a later call's slot only. The booking, or None (as
    admit_booking.lua's `take_booked`)."""
    rank, floors = request.standing.rank, request.standing.floors
    plain = request.standing is PLAIN
    # another class's soonest slot, and one of a call of the caller's own class: (its
    # slot for the caller, candidate, its state, the booker, how much later it moves
    # the bookings after it)
    bests: list[tuple[float, SourceTerms, SourceState, str, float] | None] = [None, None]
    for terms, state in candidates:
        tag_ = _tag_at(state, request)
        dims = _dims(ledger, terms, state, request.est_tokens, now)
        tokens = [d for d in dims if d.tokens]
        # a quota shared with other sources: their bookings after the slot cannot move
        movable = terms.quota is None or terms.quota.tpm is None or _own(terms)
        ahead = sorted(
            (booking[1], other)
            for other, booking in state.booked.items()
            if booking[1] > now + request.claim_s
        )[:TAKE_SCAN]
        for _, other in ahead:
            booking = state.booked[other]
            slot, theirs = booking[0], int(booking[2])
            which = int(theirs == rank)
            best = bests[which]
            shift = max((d.later_s(booking[3], request.est_tokens) for d in tokens), default=0.0)
            if slot <= now or (best is not None and slot + shift >= best[0]):
                continue
            if shift > 0 and not movable:
                continue  # the bucket has room at that slot for the booker's tokens alone
            if theirs == rank:
                booker_tag = None if booking[5] == NO_TAG else booking[5]
                if not takes_later(
                    request.arrival, rank, int(booking[4]), theirs, tag_, booker_tag
                ):
                    continue  # its own class: one that comes before it
            elif plain or slot_goes_to(rank, theirs, state.slot_credits, floors) != rank:
                continue  # higher, or owed a slot
            bests[which] = (slot + shift, terms, state, other, shift)
    # Another class's first (the classes' order and floors come before the order within
    # one), if soon enough: no later than a new booking, and within `book_within_s`.
    soon = [
        b
        for b in bests
        if b is not None and b[0] - now <= request.book_within_s and b[0] <= fresh_slot
    ]
    if not soon:
        return None
    slot, terms, state, other, shift = soon[0]
    taken = state.booked.pop(other)
    if shift > 0:  # the bookings after it move later, so the caller's tokens have room
        for booking in state.booked.values():
            if booking[0] > taken[0]:
                booking[0] += shift
                booking[1] += shift
    # The token buckets: charged for the caller's estimate instead of the booker's. Fewer
    # tokens hand the difference back only as far as the bookings ahead allow (their
    # tokens from each one's slot on, the taken slot's now the caller's): handed back
    # further, a later booking would land on top of them. Not at all on a bucket shared
    # with other sources, whose bookings are not here.
    booked = [(max(b[0], now), b[3]) for b in state.booked.values() if b[1] > now]
    booked.append((max(taken[0], now), float(request.est_tokens)))
    booked.sort(reverse=True)
    for dim in _dims(ledger, terms, state, request.est_tokens, now):
        if not dim.tokens:
            continue
        tat = gcra_settle(dim.tat, int(taken[3]), request.est_tokens, dim.limit)
        if tat < dim.tat:
            if isinstance(dim.holder, QuotaState) and not _own(terms):
                continue  # a shared bucket: it stays charged for the booker's tokens
            after, least = 0.0, tat
            for at, cost in booked:
                after += charge_s(cost, dim.limit)
                least = max(least, at + ARRIVAL_MARGIN_S + after)
            tat = min(dim.tat, least)
        dim.charge(tat)
    return _booked(state, call_id, request, slot, now)


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
