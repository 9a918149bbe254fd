"""Store layer (memory): one admission, as admit.lua decides it, returned as a value.

Each candidate, best first, is considered (`_consider`: what its pause, breaker,
cap and quotas say); the first that nothing refuses is granted (`_grant`), each
refused one leaves what a waiting caller keeps there (a place in its queue, a
booking kept), and when all refuse, the denial names them (`_deny`), booking a
quota's slot for a caller refused by quota buckets alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from polygate_celery.core.breaker import BreakerState, breaker_admit, breaker_reopens_at
from polygate_celery.core.quota import BOOKING_SLACK_S
from polygate_celery.core.standing import CapsSay, caps_say, used_credits
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store.admit import AdmitResult, HalfOpen
from polygate_celery.store.base import AdmitRequest, BlockReason, Denial, Grant, WaitMode
from polygate_celery.store.memory.bookings import book
from polygate_celery.store.memory.quota import QuotaSay, bookable, charge, quota_say
from polygate_celery.store.memory.state import NO_TAG, Ledger, SourceState, TenantHold

# The refusals that say something of the source's health: a refused call is told its
# last error (`Denial.errors`).
_HEALTH_BLOCKS: frozenset[BlockReason] = frozenset({"paused", "breaker_open", "probe_in_flight"})
# A permit handed to a waiter its tenant's caps refuse goes on to the next waiter, unless
# the source could not run it (its health, or its limit fallen since the hand-over).
_HANDS_ON_NOT: frozenset[BlockReason] = _HEALTH_BLOCKS | {"at_capacity"}


@dataclass(frozen=True, slots=True)
class _Say:
    """What a candidate's pause, breaker, cap and quotas say of an admission: the reasons
    that refuse it, in that order; seconds until each blocker with a known end ends; the
    source's last error where its health refuses; its breaker if that admits."""

    reasons: tuple[BlockReason, ...]
    known: tuple[float, ...]
    error: str | None
    breaker: BreakerState | None
    quota: QuotaSay
    caps: CapsSay | None  # the tenant's caps there, if it has any


@dataclass(frozen=True, slots=True)
class _Refusal:
    terms: SourceTerms
    state: SourceState
    say: _Say
    booking: list[float] | None  # the call's booking there, kept
    bookable: bool  # refused by quota buckets alone, with no booking


def admit(ledger: Ledger, request: AdmitRequest, now: float) -> AdmitResult:
    """Grant a permit at the first runnable candidate, or say why none is."""
    for terms in request.candidates:  # a repeated admit returns its first grant
        if request.permit_id in ledger.source(terms).permits:
            return AdmitResult(Grant(terms.name, request.permit_id, now))
    if request.gate and (refusal := _gated(ledger, request, now)) is not None:
        return AdmitResult(refusal)
    waiter = request.call_id if request.wait is not WaitMode.NONE else None
    refusals: list[_Refusal] = []
    for terms in request.candidates:
        state = ledger.source(terms)
        state.in_use(now)  # ends lapsed claims
        mine = waiter is not None and state.handed.pop(waiter, None) is not None
        booking = state.booking(waiter, now) if waiter is not None else None
        say = _consider(ledger, terms, state, booking, request, now)
        if not say.reasons:
            return _grant(ledger, terms, state, say, booking, request, waiter, now)
        if mine and "tenant_cap" in say.reasons and _HANDS_ON_NOT.isdisjoint(say.reasons):
            ledger.hand_on(terms.name, state, now)  # its tenant's cap: the next waiter's
        if waiter is not None and not mine and say.reasons == ("at_capacity",):
            # joins the queue (or keeps its place) and renews its claim
            state.join(waiter, request.standing, request.est_tokens, request.claim_s, now)
        if booking is not None:  # kept while the call waits on
            booking[1] = max(booking[1], now + request.claim_s)
        only_quota = set(say.reasons) == {"quota"}
        can_book = booking is None and only_quota and bookable(terms, state, now)
        refusals.append(_Refusal(terms, state, say, booking, can_book))
    return AdmitResult(_deny(ledger, refusals, request, waiter, now))


def _gated(ledger: Ledger, request: AdmitRequest, now: float) -> Denial | None:
    """The gate's refusal of this call, if the scope's gate is closed to it (else the
    call may probe, and holds the gate's probe)."""
    gate = ledger.gates.get(request.scope)
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


def _consider(
    ledger: Ledger,
    terms: SourceTerms,
    state: SourceState,
    booking: list[float] | None,
    request: AdmitRequest,
    now: float,
) -> _Say:
    """What the candidate's pause, breaker, cap and quotas say of this admission."""
    reasons: list[BlockReason] = []
    known: list[float] = []
    if state.paused_until > now:
        reasons.append("paused")
        known.append(state.paused_until - now)
    breaker = breaker_admit(state.breaker, now, request.permit_id)
    if breaker is None:
        opens = breaker_reopens_at(state.breaker, now)
        reasons.append("breaker_open" if opens is not None else "probe_in_flight")
        if opens is not None:
            known.append(opens - now)
    by_health = not _HEALTH_BLOCKS.isdisjoint(reasons)
    if state.in_use(now) >= ledger.limit(state, terms):
        reasons.append("at_capacity")
    quota = quota_say(ledger, terms, state, booking, request.est_tokens, now)
    reasons += ["quota"] * len(quota.waits)
    known += quota.waits
    caps, standing = None, request.standing
    if standing.caps is not None:
        hold = _hold(state, standing.tenant)
        in_flight = hold.in_flight(state.permits)
        caps = caps_say(
            standing.caps, in_flight, hold.request_tat, hold.token_tat, request.est_tokens, now
        )
        if caps.refused:
            reasons.append("tenant_cap")
            if caps.reopen_in_s is not None:
                known.append(caps.reopen_in_s)
    return _Say(
        tuple(reasons), tuple(known), state.error if by_health else None, breaker, quota, caps
    )


def _hold(state: SourceState, tenant: str) -> TenantHold:
    hold = state.tenants.get(tenant)
    if hold is None:
        hold = state.tenants[tenant] = TenantHold()
    return hold


def _grant(
    ledger: Ledger,
    terms: SourceTerms,
    state: SourceState,
    say: _Say,
    booking: list[float] | None,
    request: AdmitRequest,
    waiter: str | None,
    now: float,
) -> AdmitResult:
    """Admit at `terms`; a waiting caller leaves every queue, and a permit handed to it
    at another candidate goes on to the next waiter there."""
    assert say.breaker is not None
    permit_id = request.permit_id
    probe = say.breaker.probe == permit_id and state.breaker.probe != permit_id
    half_open = None
    if probe and state.breaker.mode == "open":  # this admission turned it half-open
        opened = None if state.opened_at is None else now - state.opened_at
        half_open = HalfOpen(terms.name, opened, state.error)
    state.breaker = say.breaker
    if booking is not None:  # paid when booked
        state.permits.add(permit_id)
        if booking[5] != NO_TAG:  # a tenant's slot used: its class's virtual time moves on
            rank, fair = request.standing.rank, state.quota_fair
            fair.virtual[rank] = max(fair.virtual.get(rank, 0.0), booking[5])
    else:
        charge(ledger, terms, state, permit_id, say.quota, now)
    if say.caps is not None:  # counted against its tenant's caps
        hold = _hold(state, request.standing.tenant)
        hold.permits.add(permit_id)
        hold.request_tat, hold.token_tat = say.caps.request_tat, say.caps.token_tat
    floors = request.standing.floors
    if floors and (booking is not None or terms.quota is not None or say.quota.learned):
        # a quota's slot used: the classes' credits on them (floors)
        state.slot_credits = used_credits(state.slot_credits, request.standing.rank, floors)
    handed_on: list[tuple[str, str]] = []
    if waiter is not None:  # out of every queue; a permit handed to it elsewhere moves on
        for other in request.candidates:
            other_state = ledger.source(other)
            other_state.queue.pop(waiter, None)
            other_state.booked.pop(waiter, None)  # (one elsewhere lapses unused)
            if other_state.handed.pop(waiter, None) is None:
                continue
            call_id = ledger.hand_to_waiter(other.name, other_state, now)
            if call_id is None:
                ledger.releases.released(other.name)
            else:
                handed_on.append((call_id, other.name))
    grant = Grant(terms.name, permit_id, now, probe=probe)
    return AdmitResult(grant, tuple(handed_on), half_open)


def _deny(
    ledger: Ledger,
    refusals: list[_Refusal],
    request: AdmitRequest,
    waiter: str | None,
    now: float,
) -> Denial:
    """The denial naming each refusing candidate; a waiting caller refused by quota
    buckets alone, holding no booking, books a slot if one comes soon enough."""
    reopen = [max(r.say.known) for r in refusals if len(r.say.known) == len(r.say.reasons)]
    booked = [r.booking for r in refusals if r.booking is not None]
    ahead = [b[0] - now for b in booked if b[0] > now + BOOKING_SLACK_S]
    booked_in_s = min(ahead) if ahead else None
    candidates = [(r.terms, r.state) for r in refusals if r.bookable]
    if waiter is not None and candidates and not booked and request.book_within_s > 0:
        made = book(ledger, candidates, waiter, request, now)
        if made is not None:
            booked_in_s = made[0] - now
            reopen.append(booked_in_s)
            booked = [made]
    # the place its booking keeps: its arrival, and its tag if it is a tenant's
    booking = booked[0] if booked else None
    return Denial(
        reopen_in_s=min(reopen) if reopen else None,
        blocked=tuple((r.terms.name, r.say.reasons[0]) for r in refusals),
        booked_in_s=booked_in_s,
        errors=tuple((r.terms.name, r.say.error) for r in refusals if r.say.error is not None),
        arrival=int(booking[4]) if booking is not None and booked_in_s is not None else None,
        tag=booking[5]
        if booking is not None and booked_in_s is not None and booking[5] != NO_TAG
        else None,
    )
