"""Decision core: where a waiting call stands — its priority class, its tenant's share
(SPEC §8).

Calls waiting for the same source stand in one queue, ordered by class (rank 0 is
the highest), then, within a class, by weighted fair queuing on tokens: a call's
tag is its tenant's virtual finish time, ``max(V, F_tenant) + cost / weight``,
where ``V`` is the tag of the class's last call served and the cost its estimated
tokens (at least 1, so one tenant's calls keep their order). Backlogged tenants
weighted 1:2:5 are then served tokens in that ratio, and an idle tenant's share
goes to the others at once (its old tag falls behind ``V``, and counts as none: the
stores sweep such tags away). A class's virtual time only moves forward.

A class's floor (`min_share`) is the share of grants it keeps while it has
waiters: at each hand-over, a class with waiters whose share of the recent grants
(counters decayed by `DECAY` per grant) is below its floor is served before the
higher classes. On a quota, whose slots are booked ahead and can change hands, a
class's floor is kept by credit (`used_credits`): a class owed a slot keeps its
booked slots and takes a higher class's soonest one (`slot_goes_to`); within a
class, a call keeps its place (`arrival_at`): it takes the soonest slot a later call
of its class booked (`takes_later`); calls of tenants are placed there by a
fair-queuing tag of their own on the quota (`quota_tag`), so tenants share a quota's
slots by weight, in tokens, as they share permits. The stores
keep the state (the tags, the counters, the credits); these functions decide, and
the Redis scripts mirror them (`standing.lua`, `quota_floors.lua`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from polygate_celery.core.quota import gcra_reserve

_N = TypeVar("_N", int, float)

# Each grant multiplies every class's counter by this before adding 1 to the class
# served: the counters weigh about the last 1 / (1 - DECAY) = 50 grants.
DECAY = 0.98

# A tag never reaches this: the rank goes above it in a queue's score.
RANK_SPAN = 2.0**48

# Classes a configuration may declare: scores stay below 2**51, where a double still
# tells tags half a token apart.
MAX_CLASSES = 8


@dataclass(frozen=True, slots=True)
class TenantCaps:
    """A tenant's caps at each source its calls go to, fleet-wide (SPEC §8): calls in flight
    (`max_concurrency`), requests and tokens per minute (`rpm`, `tpm`, buckets counted as a
    source's own quota is: `core.quota.gcra_reserve`); None: no such cap."""

    max_concurrency: int | None = None
    rpm: int | None = None
    tpm: int | None = None

    def __bool__(self) -> bool:
        return bool(self.max_concurrency or self.rpm or self.tpm)


@dataclass(frozen=True, slots=True)
class Standing:
    """A call's place among the waiters of a source: its class's `rank` (0 highest), its
    `tenant` ("" for none) and the tenant's `weight`, and every class's floor
    (`floors[rank]`, the `min_share` of grants it keeps while it waits; () for none);
    its tenant's `caps`, if any (a call of no tenant has none)."""

    rank: int = 0
    tenant: str = ""
    weight: float = 1.0
    floors: tuple[float, ...] = ()
    caps: TenantCaps | None = None

    @property
    def plain(self) -> bool:
        """One class, no tenant: the queue is first come, first served."""
        return self.rank == 0 and not self.tenant and not any(self.floors)


PLAIN = Standing()


def tag(virtual: float, finish: float | None, est_tokens: int, weight: float) -> float:
    """A waiter's fair-queuing tag in its class: its tenant's next virtual finish."""
    start = virtual if finish is None or finish < virtual else finish
    return start + max(est_tokens, 1) / weight


def score(rank: int, tag_: float) -> float:
    """A waiter's score in its source's queue: lower is served first."""
    return rank * RANK_SPAN + min(tag_, RANK_SPAN - 1)


def rank_of(score_: float) -> int:
    """The class rank a queue score belongs to."""
    return int(score_ // RANK_SPAN)


def corrected(
    finish: float, virtual: float, est_tokens: int, used_tokens: int, weight: float
) -> float:
    """A tenant's last tag once a call of its settles having used `used_tokens` where it
    was placed for `est_tokens`: moved by the difference while the tenant is ahead of its
    class's virtual time (behind it, its next call starts at that time anyway)."""
    if finish <= virtual:
        return finish
    return finish + (max(used_tokens, 1) - max(est_tokens, 1)) / weight


def served_counts(counts: Mapping[int, float], rank: int) -> dict[int, float]:
    """The grant counters after a grant to class `rank`."""
    decayed = {r: c * DECAY for r, c in counts.items()}
    decayed[rank] = decayed.get(rank, 0.0) + 1.0
    return decayed


def used_credits(
    credits: Mapping[int, float], rank: int, floors: Sequence[float]
) -> dict[int, float]:
    """A quota's slot credits after a slot was used by class `rank` (SPEC §8). Each class
    with a floor ``f`` earns ``f`` of every slot another class uses and pays ``1 - f``
    for each it uses: while it waits and is served as its floor says, its credit goes
    round between ``-(1 - f)`` and 0, and it is owed a slot (`owed`) at 0. The credit
    stays within ``[-(1 - f), 1]``: what a class used while no other class wanted the
    slots is not held against it, and a class with no waiters is owed one slot at most
    when it comes back."""
    updated = dict(credits)
    for class_rank, floor in enumerate(floors):
        if floor > 0:
            credit = credit_of(credits, class_rank, floors)
            credit += floor - 1.0 if class_rank == rank else floor
            updated[class_rank] = min(max(credit, floor - 1.0), 1.0)
    return updated


def credit_of(credits: Mapping[int, float], rank: int, floors: Sequence[float]) -> float:
    """Class `rank`'s credit (`used_credits`); one that has none yet starts at its lowest,
    ``floor - 1``, as one that has just used its share."""
    floor = floors[rank] if rank < len(floors) else 0.0
    return credits.get(rank, floor - 1.0)


# A credit this close below 0 is 0: ten additions of 0.1 fall short of 1 by a rounding.
CREDIT_TOLERANCE = 1e-9


def owed(credits: Mapping[int, float], rank: int, floors: Sequence[float]) -> bool:
    """Whether class `rank` is owed a quota slot (`used_credits`): it has a floor, and
    its credit has come round to 0."""
    floor = floors[rank] if rank < len(floors) else 0.0
    return floor > 0 and credit_of(credits, rank, floors) >= -CREDIT_TOLERANCE


def slot_goes_to(a: int, b: int, credits: Mapping[int, float], floors: Sequence[float]) -> int:
    """Which of classes `a` and `b` a quota slot booked ahead goes to: one owed a slot
    (`owed`; of two, the one owed more), else the higher (the lower rank). A caller of
    `a` takes a slot `b` booked when it is `a`."""
    owed_a, owed_b = owed(credits, a, floors), owed(credits, b, floors)
    if owed_a != owed_b:
        return a if owed_a else b
    if owed_a:  # both owed: the one owed more
        credit_a, credit_b = credit_of(credits, a, floors), credit_of(credits, b, floors)
        if credit_a > credit_b:
            return a
        if credit_b > credit_a:
            return b
    return min(a, b)


def arrival_at(store_time_s: float) -> int:
    """A call's arrival, its place among the waiters of its class on a quota's slots
    (first come, first served; `AdmitRequest.arrival`): the store's time of its first
    grant, in microseconds, as admit.lua writes the arrival of a call's first booking."""
    return round(store_time_s * 1e6)


def takes_later(
    arrival: int | None,
    rank: int,
    booker_arrival: int,
    booker_rank: int,
    tag: float | None = None,
    booker_tag: float | None = None,
) -> bool:
    """Whether a call that arrived at `arrival`, of class `rank`, takes a slot booked ahead
    by another of its class that arrived at `booker_arrival`: a call that has arrived
    (not None) comes before every later one, so a call asking again after a failed
    attempt, or robbed of its booking, is not sent to the back of its class.

    Calls of a tenant are placed by their fair-queuing `tag` on the quota instead
    (`quota_tag`): one comes before another of its class whose tag is higher, so
    backlogged tenants' slots go by weight, in tokens. A call with a tag and one without
    (no tenant) take nothing of each other: they keep the order they booked in."""
    if booker_rank != rank:
        return False
    if tag is not None or booker_tag is not None:
        return tag is not None and booker_tag is not None and booker_tag > tag
    return arrival is not None and booker_arrival > arrival


def quota_tag(virtual: float, finish: float | None, est_tokens: int, weight: float) -> float:
    """A tenant's call's fair-queuing tag on a quota's slots, given when it first books one:
    as `tag`, from its class's virtual time on that quota (the tag of the last booked slot
    used) and its tenant's last tag there. It keeps it while it waits and retries."""
    return tag(virtual, finish, est_tokens, weight)


def tag_text(tag_: float) -> str:
    """A tag as the Redis store writes it in a booking (``%.17g``, as its scripts do): it
    reads back to the same float, and a caller that gives it back names its booking."""
    return format(tag_, ".17g")


def named_for(ident: str, tenant: str) -> str:
    """A call's or a permit's id, `ident`, named for its `tenant` (``<ident>/<tenant>``; as
    it is for a call of no tenant): a store's view counts waiters and permits per tenant
    by it (`tenant_of`). A tenant holds no ``/``."""
    return f"{ident}/{tenant}" if tenant else ident


def tenant_of(ident: str) -> str:
    """The tenant a call's or a permit's id is named for (`named_for`); "" for none."""
    _, slash, tenant = ident.rpartition("/")
    return tenant if slash else ""


class CapsSay(NamedTuple):
    """What a tenant's caps at a source say of one more call of its there: whether they
    refuse it, and when they admit it (None: not known, a call in flight must end
    first); the tenant's bucket times once the call is charged (as they were if refused)."""

    refused: bool
    reopen_in_s: float | None
    request_tat: float
    token_tat: float


def caps_say(
    caps: TenantCaps,
    in_flight: int,
    request_tat: float,
    token_tat: float,
    est_tokens: int,
    now: float,
) -> CapsSay:
    """A tenant's caps at a source, holding `in_flight` calls there (permits still held)
    with buckets at `request_tat` and `token_tat`, asked for a call of `est_tokens`."""
    waits: list[float] = []
    full = caps.max_concurrency is not None and in_flight >= caps.max_concurrency
    req, tok = request_tat, token_tat
    if caps.rpm:
        req, wait = gcra_reserve(request_tat, now, 1, caps.rpm)
        if wait is not None:
            waits.append(wait)
    if caps.tpm and est_tokens > 0:
        tok, wait = gcra_reserve(token_tat, now, est_tokens, caps.tpm)
        if wait is not None:
            waits.append(wait)
    if not full and not waits:
        return CapsSay(False, None, req, tok)
    return CapsSay(True, None if full else max(waits), request_tat, token_tat)


def next_class(waiting: Sequence[int], counts: Mapping[int, float], floors: Sequence[float]) -> int:
    """Which class is served next, of the ranks with waiters (`waiting`, non-empty): the
    one furthest below its floor, if any is below it, else the highest."""
    total = sum(counts.values())
    below: list[tuple[float, int]] = []
    for rank in waiting:
        floor = floors[rank] if rank < len(floors) else 0.0
        if floor <= 0:
            continue
        share = counts.get(rank, 0.0) / total if total > 0 else 0.0
        if share < floor:
            below.append((share / floor, rank))
    if below:
        return min(below)[1]
    return min(waiting)


def per_class(ranks: Iterable[int]) -> tuple[int, ...]:
    """How many of `ranks` fall in each class, by rank (trailing empty classes left out)."""
    counts = [0] * MAX_CLASSES
    for rank in ranks:
        counts[min(rank, MAX_CLASSES - 1)] += 1
    return trimmed(counts)


def per_rank(counters: Mapping[int, float]) -> tuple[float, ...]:
    """Grant counters by rank (trailing zeros left out)."""
    return trimmed([counters.get(rank, 0.0) for rank in range(MAX_CLASSES)])


def trimmed(values: Sequence[_N]) -> tuple[_N, ...]:
    """`values` without their trailing zeros."""
    end = len(values)
    while end and not values[end - 1]:
        end -= 1
    return tuple(values[:end])
