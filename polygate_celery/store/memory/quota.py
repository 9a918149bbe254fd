"""Store layer (memory): an admission's quotas, declared and learned, as admit.lua's.

What a candidate's quotas say of an admission (`quota_say`: the waits of those
that refuse it, else what admitting charges them), the charge itself, and the
buckets a booking charges (`quota_dims`; the booking itself: `bookings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polygate_celery.core.quota import (
    BOOKING_SLACK_S,
    gcra_charge,
    gcra_reserve,
    gcra_settle,
    window_wait,
)
from polygate_celery.core.terms import QuotaTerms, SourceTerms, follows_provider_windows
from polygate_celery.store.memory.state import Ledger, QuotaState, SourceState


@dataclass(frozen=True, slots=True)
class QuotaSay:
    """What a candidate's quotas say: seconds until each that refuses may admit (one
    ``"quota"`` reason each); else the new ``(request_tat, token_tat)`` of its declared
    quota (None if it has none, or its slot is booked) and of its learned limits."""

    waits: tuple[float, ...] = ()
    declared: tuple[float, float] | None = None
    learned: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Dim:
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


def quota_dims(
    ledger: Ledger, terms: SourceTerms, state: SourceState, est_tokens: int, now: float
) -> list[Dim]:
    """The quota buckets an admission at `terms` is charged to."""
    dims: list[Dim] = []
    quota = terms.quota
    if quota is not None:
        qs = ledger.quota(quota.name)
        if quota.rpm is not None:
            dims.append(Dim(qs.request_tat, 1, quota.rpm, qs, "request_tat"))
        if quota.tpm is not None and est_tokens > 0:
            dims.append(Dim(qs.token_tat, est_tokens, quota.tpm, qs, "token_tat", True))
    # (a caller refused by a provider's window is not bookable: see `bookable`)
    for dimension, bucket in state.learned.live(now).items():
        cost = 1 if dimension == "req" else est_tokens
        if cost > 0:
            dims.append(Dim(bucket.tat, cost, bucket.limit, bucket, "tat", dimension != "req"))
    return dims
