"""Store layer (memory): the booking of a quota's slot, as admit_booking.lua's.

A caller refused by quota buckets alone books the soonest slot they give
(`core.quota.gcra_book`, see `AdmitRequest.book_within_s`), or takes a sooner one a
call it is served before booked (`take_booked`, SPEC §8), and the booker it was taken
from is booked anew at once and told (`rebook`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from polygate_celery.core.quota import ARRIVAL_MARGIN_S, charge_s, gcra_book, gcra_settle
from polygate_celery.core.standing import (
    PLAIN,
    Standing,
    arrival_at,
    quota_tag,
    slot_goes_to,
    takes_later,
)
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store.base import AdmitRequest
from polygate_celery.store.memory.quota import Dim, quota_dims
from polygate_celery.store.memory.state import NO_TAG, Ledger, QuotaState, SourceState


def book(
    ledger: Ledger,
    candidates: list[tuple[SourceTerms, SourceState]],
    call_id: str,
    request: AdmitRequest,
    now: float,
) -> list[float] | None:
    """Book the soonest slot the quotas of one candidate give, if soon enough: the booking
    (`SourceState.booked`'s entry). A sooner slot a lower class, or a call of the caller's
    class it comes before, booked is taken instead (`take_booked`), and its booker is
    booked the next slot it comes to at once (`rebook`)."""
    robbed: list[_Robbed] = []
    made = _book(ledger, candidates, call_id, request, now, robbed)
    rebook(ledger, robbed, request, now)
    return made


def _book(
    ledger: Ledger,
    candidates: list[tuple[SourceTerms, SourceState]],
    call_id: str,
    request: AdmitRequest,
    now: float,
    robbed: list[_Robbed],
    fits: bool = False,
) -> list[float] | None:
    best: tuple[float, list[float], list[Dim], SourceState] | None = None
    for terms, state in candidates:
        dims = quota_dims(ledger, terms, state, request.est_tokens, now)
        slot, tats = gcra_book([(d.tat, d.cost, d.limit) for d in dims], now)
        if best is None or slot < best[0]:
            best = (slot, tats, dims, state)
    assert best is not None
    slot, tats, dims, state = best
    if request.standing is not PLAIN or request.arrival is not None:
        taken = take_booked(ledger, candidates, call_id, request, slot, now, robbed, fits)
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
    robbed: list[_Robbed],
    fits: bool = False,
) -> list[float] | None:
    """A slot ahead that a waiter of a class the caller's is served before booked at one
    of `candidates`, or a call of the caller's class it comes before (a later one, or,
    between tenants' calls, one of a higher tag: `core.standing.takes_later`), no later
    than a new booking's (`fresh_slot`) and within `book_within_s`: taken for the caller
    (SPEC §8), its quota paid already (the token buckets charged for the caller's
    estimate instead of the booker's). The waiter it was taken from goes into `robbed`,
    to be booked anew (`rebook`). Another class's slot is taken before one of the
    caller's own class, if either is soon enough.

    On a quota of tokens, the bucket has room at a slot for its booker's tokens: a caller
    of a larger estimate taking it is admitted later by the difference, and every booking
    after the slot moves as much later (they were placed after the booker's tokens; their
    bookers are told, as `rebook` tells). On a quota shared with other sources (a
    ``[quotas]`` entry), whose bookings are not moved from here, such a slot is not taken.

    Looks at the `TAKE_SCAN` soonest bookings ahead of each candidate; of two classes, a
    slot goes to one owed a slot there, else to the higher (`core.standing.slot_goes_to`);
    a `PLAIN` caller takes a later call's slot only. The booking, or None (as
    admit_booking.lua's `take_booked`)."""
    found = _takeable(ledger, candidates, request, fresh_slot, now, fits)
    if found is None:
        return None
    slot, terms, state, other, shift = found
    taken = state.booked.pop(other)
    # its booker is booked anew at once (`rebook`), unless robbed by another class while
    # its own has a floor: it may be owed a slot by the time it asks, and take one back
    rank, floors, theirs = request.standing.rank, request.standing.floors, int(taken[2])
    if theirs == rank or not (floors[theirs:] or (0.0,))[0]:
        robbed.append(_Robbed(other, taken, terms, state))
    if shift > 0:  # the bookings after it move later, so the caller's tokens have room
        for booker, booking in state.booked.items():
            if booking[0] > taken[0]:
                booking[0] += shift
                booking[1] += shift
                ledger.releases.move_call(booker, terms.name, booking[0] - now)
    _charge_taker(ledger, terms, state, taken, request.est_tokens, now)
    return _booked(state, call_id, request, slot, now)


def _takeable(
    ledger: Ledger,
    candidates: list[tuple[SourceTerms, SourceState]],
    request: AdmitRequest,
    fresh_slot: float,
    now: float,
    fits: bool,
) -> tuple[float, SourceTerms, SourceState, str, float] | None:
    """The slot `take_booked` takes: (its slot for the caller, candidate, its state, the
    booker, how much later it moves the bookings after it), or None."""
    rank, floors = request.standing.rank, request.standing.floors
    plain = request.standing is PLAIN
    # another class's soonest slot, and one of a call of the caller's own class: (its
    # slot for the caller, candidate, its state, the booker, how much later it moves
    # the bookings after it)
    bests: list[tuple[float, SourceTerms, SourceState, str, float] | None] = [None, None]
    for terms, state in candidates:
        tag_ = _tag_at(state, request)
        dims = quota_dims(ledger, terms, state, request.est_tokens, now)
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
            if shift > 0 and (fits or not movable):
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
    return soon[0] if soon else None


def _charge_taker(
    ledger: Ledger,
    terms: SourceTerms,
    state: SourceState,
    taken: list[float],
    est_tokens: int,
    now: float,
) -> None:
    """The token buckets of a slot `taken` for a caller of `est_tokens`: charged for its
    estimate instead of the booker's. Fewer
    tokens hand the difference back only as far as the bookings ahead allow (their
    tokens from each one's slot on, the taken slot's now the caller's): handed back
    further, a later booking would land on top of them. Not at all on a bucket shared
    with other sources, whose bookings are not here."""
    booked = [(max(b[0], now), b[3]) for b in state.booked.values() if b[1] > now]
    booked.append((max(taken[0], now), float(est_tokens)))
    booked.sort(reverse=True)
    for dim in quota_dims(ledger, terms, state, est_tokens, now):
        if not dim.tokens:
            continue
        tat = gcra_settle(dim.tat, int(taken[3]), est_tokens, dim.limit)
        if tat < dim.tat:
            if isinstance(dim.holder, QuotaState) and not _own(terms):
                continue  # a shared bucket: it stays charged for the booker's tokens
            after, least = 0.0, tat
            for at, cost in booked:
                after += charge_s(cost, dim.limit)
                least = max(least, at + ARRIVAL_MARGIN_S + after)
            tat = min(dim.tat, least)
        dim.charge(tat)


@dataclass(frozen=True, slots=True)
class _Robbed:
    """A booking taken from its booker (`take_booked`): whose, what it was, and where."""

    call_id: str
    booking: list[float]
    terms: SourceTerms
    state: SourceState


MOVES = 32  # the robbed booked anew at once, per booking (as admit_booking.lua)


def rebook(ledger: Ledger, robbed: list[_Robbed], request: AdmitRequest, now: float) -> None:
    """Book each booker `robbed` of its slot the slot it would take were it to ask now
    (`book`: the soonest a call of its class it comes before booked, whose booker is
    booked anew in turn, else a new one), and tell it (`ReleaseHub.move_call`): it waits
    on for that slot instead of asking at its old one to learn it. At most `MOVES` per
    booking; one left over (or one of no tokens where the caller's has some, or the
    other way round: other buckets) finds its slot gone when it asks, and books then.
    Its terms are the caller's (the classes' floors; its horizon, the scope's stall
    window as the caller has it left) but for its place, estimate and claim, kept in its
    booking. It takes no slot that would move the bookings after it (`fits`: those of
    calls served before it, the caller's among them); with none within the horizon it
    is told to ask now, and books with its own then (as admit_booking.lua's `rebook`)."""
    for _ in range(MOVES):
        if not robbed:
            return
        r = robbed.pop(0)
        slot, until, rank, est, arrival, tag_ = r.booking
        if (est > 0) != (request.est_tokens > 0):
            continue
        standing = request.standing
        if standing is not PLAIN:
            standing = Standing(rank=int(rank), floors=standing.floors)
        theirs = dataclasses.replace(
            request,
            call_id=r.call_id,
            est_tokens=int(est),
            claim_s=until - slot,
            book_within_s=request.book_within_s,
            standing=standing,
            arrival=int(arrival),
            tag=None if tag_ == NO_TAG else tag_,
        )
        made = _book(ledger, [(r.terms, r.state)], r.call_id, theirs, now, robbed, fits=True)
        # (none within the caller's horizon: it asks now, and books with its own then)
        ledger.releases.move_call(r.call_id, r.terms.name, 0.0 if made is None else made[0] - now)


def _own(terms: SourceTerms) -> bool:
    """Whether `terms`'s declared quota is the source's own (not shared with others)."""
    return terms.quota is not None and terms.quota.name == f"source:{terms.name}"
