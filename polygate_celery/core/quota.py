"""Decision core: RPM/TPM quotas over a 60 s period, as a sliding window or a bucket.

**Bucket** (a generic cell rate algorithm, GCRA; requests by default, tokens
always): one "theoretical arrival time" (TAT) per dimension. A request of cost ``c`` moves
the TAT by ``c * 60 / limit``; it conforms while the TAT stays within one period
of now, so a full minute's allowance may be spent at once after an idle minute,
then refills evenly. That matches a provider's token bucket; against a provider
that counts in windows, the evenly refilled requests after a burst are refused. The
provider counts a request when it arrives, up to `ARRIVAL_MARGIN_S` after its admission,
so an admission is checked as if it arrived at once and charged as if it arrived that
late: arrivals that trail their admissions unevenly, by up to the margin, still find the
provider's bucket of the same size able to take them. A full bucket so admits ``limit *
BURST_S / 60`` at once (59 of 60), then one per ``60 / limit`` seconds.
Tokens are reserved from an estimate before the attempt and settled with the
real usage after (a refund moves the TAT back). Real providers refill
continuously (Anthropic documents a token bucket; OpenAI replenishes
continuously), hence the default.

**Sliding window** (requests, ``rpm_window = "sliding"``): at most `limit`
admissions in any window of one period (plus `WINDOW_MARGIN_S`), kept as a log
of admission times. It never exceeds what a provider allows, whether the
provider counts in sliding windows, fixed windows or a token bucket of the same
size, at the price of throughput against a bucket.

**Learned** (from the provider's rate-limit headers, `learned_tat`): a source
whose answers announce a limit and what remains of it gets a bucket of that
limit, charged on each admission like a declared one and moved forward by each
announcement, fleet-wide, until `LEARNED_TTL_S` passes without one. It holds
beside any declared quota.

**Learned windows** (requests, `counts_in_windows`): an answer also says when its
limit is fully replenished (its reset). A bucket's reset is the time its spent share
takes to refill, ``(limit - remaining) * 60 / limit``; a provider that counts in
windows announces the end of its window instead, far from that (the first request of
a window: one spent, the reset a minute away). While such answers keep coming (within
`WINDOW_KEPT_S`), and unless the user declared `rpm_window`, requests follow the
provider's own window (`window_take`): what remains of it until it ends, then the
whole limit, the declared rpm (if lower) included; the declared bucket is then only
charged, as a sliding window charges it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PERIOD_S = 60.0
ARRIVAL_MARGIN_S = 0.5
"""How long after its admission a granted request may reach the provider, which counts
arrivals: a sliding window keeps each admission this much longer than a period, a bucket
keeps this much refill in hand (its burst is this much shorter than a period's)."""
WINDOW_MARGIN_S = ARRIVAL_MARGIN_S
WINDOW_S = PERIOD_S + WINDOW_MARGIN_S
BURST_S = PERIOD_S - ARRIVAL_MARGIN_S
"""What a full bucket admits at once, in seconds of its refill: a period less the margin."""


def window_wait(admitted: Sequence[float], now: float, limit: int) -> float | None:
    """Seconds until the sliding window admits one more, or None when it does now.

    `admitted` holds the admission times still in the window (those after
    ``now - WINDOW_S``), oldest first.
    """
    excess = len(admitted) - limit
    if excess < 0:
        return None
    return max(0.0, admitted[excess] + WINDOW_S - now)


def gcra_reserve(tat: float, now: float, cost: float, limit: int) -> tuple[float, float | None]:
    """Try to spend `cost` units. Returns ``(new_tat, None)`` or ``(tat, retry_in_s)``.

    It conforms if it would were it to arrive now, and is charged as arriving
    `ARRIVAL_MARGIN_S` later. A cost above the limit is charged as the whole limit:
    such a request is admitted once the quota is fully refilled instead of never.
    """
    charge = charge_s(cost, limit)
    over = max(tat - now, 0.0) + charge - PERIOD_S  # (exact for a full bucket: no rounding)
    if over > 0:
        return tat, over
    return max(tat, now + ARRIVAL_MARGIN_S) + charge, None


def gcra_charge(tat: float, now: float, limit: int) -> float:
    """Charge one request to the bucket without enforcing it (at most a period ahead).

    A sliding window does this on each admission, so that workers counting the
    same quota as a bucket (during a rolling upgrade) see its admissions.
    """
    return min(max(tat, now) + PERIOD_S / limit, now + PERIOD_S)


def gcra_adjust(tat: float, delta: float, limit: int) -> float:
    """Move the TAT by `delta` units (negative refunds) after the real cost is known."""
    return tat + delta * (PERIOD_S / limit)


def gcra_settle(tat: float, reserved: float, used: float, limit: int) -> float:
    """Replace a reservation of `reserved` units by the `used` ones (0 refunds it).

    Both are clamped to the limit, as `gcra_reserve` charged the reservation.
    """
    return tat + charge_s(used, limit) - charge_s(reserved, limit)


def charge_s(cost: float, limit: int) -> float:
    """What `cost` units move a TAT by, clamped to the limit as `gcra_reserve` does."""
    return min(max(cost, 0.0), float(limit)) * PERIOD_S / limit


LEARNED_TTL_S = 3600.0
"""A learned limit is forgotten this long after the provider last announced it (a
source moved to another provider or tier keeps no stale limit)."""


def learned_tat(tat: float, now: float, limit: int, remaining: int) -> float:
    """The bucket's TAT once the provider announced `remaining` of `limit` left, now.

    Read as a bucket: ``limit - remaining`` spent, refilling evenly over a period.
    Never earlier than the fleet's own count: the announcement may be older than
    admissions made since, and it may only add what the fleet did not count
    (other users of the key, requests the provider counted and the fleet did not).
    """
    spent = limit - min(max(remaining, 0), limit)
    return max(tat, now + spent * PERIOD_S / limit)


def gcra_spent(tat: float, now: float, limit: int) -> float:
    """Units of the period's allowance spent as of `now` (0 when the TAT is not ahead).

    A TAT `t` seconds ahead of now, less the margin each admission is charged ahead
    (`gcra_reserve`), means ``t / 60`` of the allowance is spent; an underestimate
    settled after admission may take it past the limit.
    """
    return max(0.0, tat - now - ARRIVAL_MARGIN_S) * limit / PERIOD_S


def requests_spent(
    rpm: int | None, window: str | None, in_window: int, tat: float, now: float
) -> float | None:
    """Requests of the minute's allowance spent as of `now`: the admissions in the sliding
    window, or the bucket's spent share (None without an rpm limit)."""
    if rpm is None:
        return None
    return float(in_window) if window == "sliding" else gcra_spent(tat, now, rpm)


BOOKING_SLACK_S = 0.01
"""A booking may be used this long before its slot: a caller's own clock may wake it a
little before the store's says the slot has come (a small part of the arrival margin)."""


def gcra_book(dims: Sequence[tuple[float, float, int]], now: float) -> tuple[float, list[float]]:
    """Book `cost` units of each dimension ``(tat, cost, limit)`` for the soonest time all
    of them admit it: returns that slot and the new TATs, charged as at the slot.

    A caller the buckets refuse books its place instead of asking again and again: callers
    that book are admitted in the order they booked, each at its slot, never two for one
    refill. The units are charged as `gcra_reserve` would charge them at the slot, so a
    booking counts exactly as an admission at its slot (one abandoned is simply not used).
    """
    slot = now
    for tat, cost, limit in dims:
        slot = max(slot, now + max(tat - now, 0.0) + charge_s(cost, limit) - PERIOD_S)
    late = slot + ARRIVAL_MARGIN_S
    return slot, [max(tat, late) + charge_s(cost, limit) for tat, cost, limit in dims]


RESET_EVIDENCE_S = 10.0
"""How far an announced reset must be from a bucket's refill time (beyond one request's
refill) to show a window: more than a reset's rounding (Anthropic's whole seconds),
the answer's own latency and a modest skew of the provider's clock."""
WINDOW_KEPT_S = 300.0
"""Requests follow the provider's window this long after the last answer that showed
one (a provider counting in windows shows it at the start of each window it is used in)."""


def counts_in_windows(
    limit: int | None, remaining: int | None, reset_s: float | None
) -> bool | None:
    """Whether an answer's announced requests limit, remaining and reset show a provider
    that counts in windows (True), are what a bucket would announce (False), or say
    nothing of it (None: absent, out of range, or a reset longer than a period, such as
    a daily limit's).

    A bucket with ``limit - remaining`` spent is full again ``(limit - remaining) * 60 /
    limit`` seconds on (less up to one request's refill, as `remaining` is rounded
    down); a reset further from that than `RESET_EVIDENCE_S` is a window's end.
    """
    if limit is None or remaining is None or reset_s is None:
        return None
    if limit < 1 or not 0 <= remaining <= limit:
        return None
    if not math.isfinite(reset_s) or not 0 <= reset_s <= PERIOD_S + RESET_EVIDENCE_S:
        return None
    refill = (limit - remaining) * PERIOD_S / limit
    return abs(reset_s - refill) > PERIOD_S / limit + RESET_EVIDENCE_S


def window_learn(
    end: float, left: float, now: float, remaining: int, reset_s: float
) -> tuple[float, float]:
    """The provider's window ``(end, left)`` once an answer announced `remaining` and a
    reset `reset_s` from `now` (both already checked by `counts_in_windows`).

    With no window running, the announced one is taken. Else an announcement of the same
    window (its end no more than `RESET_EVIDENCE_S` before the one known) may only take
    from what is left and push the end later, never give back what the fleet counted; an
    earlier end is an answer of a window past (it came late) and is not taken.
    """
    announced = now + reset_s
    if end <= now:
        return announced, float(remaining)
    if announced >= end - RESET_EVIDENCE_S:
        return max(end, announced), min(left, float(remaining))
    return end, left


def window_take(
    end: float, left: float, now: float, limit: int, declared: int | None = None
) -> tuple[float, float] | float:
    """One request in the provider's window of `limit`: the new ``(end, left)``, or
    seconds to wait. A `declared` rpm lower than the limit holds back the difference.

    What is left is spent until `ARRIVAL_MARGIN_S` before the window ends (a request
    admitted later might reach the provider in the next window); from the end on, a new
    window opens, its end guessed a period after the request reaches the provider, until
    an answer announces it.
    """
    if now >= end:
        return now + ARRIVAL_MARGIN_S + PERIOD_S, float(limit - 1)
    held_back = max(0, limit - declared) if declared is not None else 0
    if left - held_back >= 1 and now < end - ARRIVAL_MARGIN_S:
        return end, left - 1
    return end - now


def window_charge(end: float, left: float, now: float) -> float:
    """What is left of the provider's window after one request admitted while requests
    are counted as a bucket (the window is only kept up to date, not enforced)."""
    return max(0.0, left - 1) if now < end else left
