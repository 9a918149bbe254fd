"""Store contract: tenants share a quota's slots by weight, in tokens (SPEC §8).

Calls of a tenant waiting for a quota are placed by a fair-queuing tag of their own
there (`core.standing.quota_tag`), given by their first booking: a call takes the
soonest slot a call of its class with a higher tag booked, and that call, finding its
slot gone at its time, takes the next one's. Backlogged tenants weighted 1:2:5 so get
the quota's tokens in that ratio, whatever their calls cost; calls of no tenant keep
the order they booked in.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

import pytest

from polygate_celery.core.standing import Standing
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store import Denial, Grant
from tests.unit.store.conftest import Harness

# 1,000 tokens a second, the source's own quota (as `governance.plan` names it)
TPM = SourceTerms("tpm", 64, quota=QuotaTerms("source:tpm", tpm=60_000))
WITHIN = {"book_within_s": 300.0}

# Weights 1:2:5, calls of 100, 300 and 1,000 tokens (issue 38's workload).
TENANTS = {
    "a": (Standing(rank=0, tenant="a", weight=1.0), 100),
    "b": (Standing(rank=0, tenant="b", weight=2.0), 300),
    "c": (Standing(rank=0, tenant="c", weight=5.0), 1000),
}


class Bucket:
    """The provider's own token bucket (60,000 TPM, a minute's burst): every admission the
    store makes must fit it."""

    def __init__(self) -> None:
        self.tat = 0.0

    def takes(self, now: float, tokens: int) -> None:
        over = max(self.tat - now, 0.0) + tokens / 1000 - 60.0
        assert over <= 1e-6, f"{tokens} tokens at {now:.3f} s go {over:.3f} s over the quota"
        self.tat = max(self.tat, now) + tokens / 1000


async def spend_the_burst(h: Harness, provider: Bucket | None = None) -> None:
    """Calls that do not wait spend the bucket's burst, to its last token."""
    for tokens in (1000, 100, 10, 1):
        while isinstance(answer := await h.admit(TPM, est_tokens=tokens), Grant):
            if provider is not None:
                provider.takes(h.clock.now(), tokens)
            await h.settle(answer, TPM, est_tokens=tokens, used_tokens=tokens)


async def book(h: Harness, waiter: str, tenant: str) -> float:
    """`waiter`, a call of `tenant`, books a slot: its slot on the clock."""
    standing, tokens = TENANTS[tenant]
    denial = await h.deny(TPM, waiter=waiter, est_tokens=tokens, standing=standing, **WITHIN)
    assert denial.booked_in_s is not None
    return h.clock.now() + denial.booked_in_s


async def test_a_tenants_call_takes_the_slot_of_one_tagged_after_it(h: Harness) -> None:
    await spend_the_burst(h)
    # c's calls (1,000 tokens, weight 5) tag 200, 400, 600; a's first (100, weight 1) 100
    slots = {waiter: await book(h, waiter, "c") for waiter in ("c1", "c2", "c3")}
    assert [h.tags[w] for w in ("c1", "c2", "c3")] == pytest.approx([200, 400, 600])
    taken = await book(h, "a1", "a")
    assert h.tags["a1"] == pytest.approx(100)
    assert taken == pytest.approx(slots["c1"])  # the soonest of a higher tag
    # c1 finds its slot gone at its time and takes c2's, tagged after it
    h.clock.advance(slots["c1"] - h.clock.now())
    standing, tokens = TENANTS["a"]
    assert isinstance(
        await h.admit(TPM, waiter="a1", est_tokens=tokens, standing=standing, **WITHIN), Grant
    )
    assert await book(h, "c1", "c") == pytest.approx(slots["c2"])
    assert h.tags["c1"] == pytest.approx(200)  # it keeps its tag


async def test_a_second_call_of_a_tenant_is_tagged_after_its_first(h: Harness) -> None:
    await spend_the_burst(h)
    await book(h, "c1", "c")
    await book(h, "a1", "a")
    await book(h, "a2", "a")
    assert h.tags["a2"] == pytest.approx(200)  # after a1's 100
    # c1 (200) came first, at the tie: a2 takes no slot of it
    await book(h, "a3", "a")
    assert h.tags["a3"] == pytest.approx(300)


async def test_calls_of_no_tenant_keep_the_order_they_booked_in(h: Harness) -> None:
    await spend_the_burst(h)
    plain = Standing(rank=0)
    first = await h.deny(TPM, waiter="p1", est_tokens=1000, standing=plain, **WITHIN)
    assert first.tag is None
    a1 = await book(h, "a1", "a")
    assert first.booked_in_s is not None
    assert a1 > h.clock.now() + first.booked_in_s  # it took no slot of a call of no tenant


async def backlog(h: Harness, seconds: float, a_stops_at: float) -> list[tuple[float, str, int]]:
    """Four callers per tenant keep calls waiting for the quota, one after another, each
    settled as soon as it is admitted, for `seconds` after the burst is spent; tenant a
    makes no new call after `a_stops_at`. (time, tenant, tokens) of each admission."""
    provider = Bucket()
    await spend_the_burst(h, provider)
    start = h.clock.now()
    ids = itertools.count()
    events: list[tuple[float, int, str, str]] = []  # (when, order, tenant, call)
    for tenant in TENANTS:
        for _ in range(4):
            n = next(ids)
            heapq.heappush(events, (start, n, tenant, f"{tenant}{n}"))
    served: list[tuple[float, str, int]] = []
    while events and events[0][0] < start + seconds:
        when, _, tenant, call = heapq.heappop(events)
        h.clock.advance(max(0.0, when - h.clock.now()))
        standing, tokens = TENANTS[tenant]
        answer = await h.admit(TPM, waiter=call, est_tokens=tokens, standing=standing, **WITHIN)
        if isinstance(answer, Grant):
            served.append((h.clock.now() - start, tenant, tokens))
            provider.takes(h.clock.now(), tokens)
            await h.settle(answer, TPM, est_tokens=tokens, used_tokens=tokens, standing=standing)
            if tenant != "a" or h.clock.now() - start < a_stops_at:
                n = next(ids)  # the caller's next call
                heapq.heappush(events, (h.clock.now(), n, tenant, f"{tenant}{n}"))
            continue
        assert isinstance(answer, Denial)
        wait = answer.booked_in_s if answer.booked_in_s is not None else answer.reopen_in_s
        assert wait is not None
        heapq.heappush(events, (h.clock.now() + wait, next(ids), tenant, call))
    return served


def shares(served: list[tuple[float, str, int]], start: float) -> Counter[str]:
    """The tokens each tenant was admitted in the 60 s from `start`."""
    tokens: Counter[str] = Counter()
    for at, tenant, cost in served:
        if start <= at < start + 60.0:
            tokens[tenant] += cost
    return tokens


async def test_a_larger_call_taking_a_slot_moves_the_bookings_after_it(h: Harness) -> None:
    """The bucket has room at a slot for its booker's tokens: a call of 1,000 tokens
    taking a slot booked for 100 is admitted 0.9 s after it, and every booking after it
    moves 0.9 s later, so no admission goes over the provider's quota."""
    provider = Bucket()
    await spend_the_burst(h, provider)
    slots = {w: await book(h, w, t) for w, t in (("a1", "a"), ("a2", "a"), ("c1", "c"))}
    assert slots["c1"] == pytest.approx(slots["a2"] + 1.0)  # room for its 1,000 tokens
    h.tags["c2"] = 150.0  # (a call of c given a tag below a2's and c1's, 200)
    c2 = await book(h, "c2", "c")
    assert c2 == pytest.approx(slots["a2"] + 0.9)  # a2's slot, 0.9 s on: before c1's
    # the bookings after a2's, c1's among them, moved 0.9 s later
    for waiter, tenant in (("a1", "a"), ("c2", "c"), ("c1", "c")):
        standing, tokens = TENANTS[tenant]
        due = c2 + 1.0 if waiter == "c1" else slots["a1"] if waiter == "a1" else c2
        if waiter == "c1":
            h.clock.advance(slots["c1"] - h.clock.now())  # its old slot: told to wait on
            early = await h.deny(TPM, waiter="c1", est_tokens=tokens, standing=standing, **WITHIN)
            assert early.booked_in_s == pytest.approx(0.9)
        h.clock.advance(due - h.clock.now())
        answer = await h.admit(TPM, waiter=waiter, est_tokens=tokens, standing=standing, **WITHIN)
        assert isinstance(answer, Grant), waiter
        provider.takes(h.clock.now(), tokens)


async def test_small_calls_taking_big_bookings_slots_never_overrun_the_quota(
    h: Harness,
) -> None:
    """Bookings of half a minute's tokens each, small calls taking their slots, then a
    call of a whole minute's: every admission fits the provider's bucket (the tokens a
    taker hands back to the bucket are bounded by the bookings ahead; handed back in
    full, the last booking landed on top of the bookings after the slots)."""
    provider = Bucket()
    tenants = {t: (Standing(rank=0, tenant=t, weight=1.0), 0) for t in "wxyz"}
    calls = [("x1", "x", 30_000), ("x2", "x", 30_000), ("y", "x", 30_000)]
    calls += [("z1", "z", 1), ("z2", "z", 1), ("w", "w", 60_000)]
    grant = await h.grant(TPM, est_tokens=60_000)  # the whole burst
    provider.takes(h.clock.now(), 60_000)
    await h.settle(grant, TPM, est_tokens=60_000, used_tokens=60_000)
    slots = {}
    for waiter, tenant, tokens in calls:
        denial = await h.deny(
            TPM, waiter=waiter, est_tokens=tokens, standing=tenants[tenant][0], **WITHIN
        )
        assert denial.booked_in_s is not None
        slots[waiter] = h.clock.now() + denial.booked_in_s
    pending = dict(calls_by_name(calls))
    while pending:  # each asks at the slot it was last told of, the soonest first
        waiter = min(pending, key=lambda w: slots[w])
        h.clock.advance(max(0.0, slots[waiter] - h.clock.now()))
        tenant, tokens = pending[waiter]
        answer = await h.admit(
            TPM, waiter=waiter, est_tokens=tokens, standing=tenants[tenant][0], **WITHIN
        )
        if isinstance(answer, Grant):
            provider.takes(h.clock.now(), tokens)
            del pending[waiter]
        else:
            assert answer.booked_in_s is not None, (waiter, answer)
            slots[waiter] = h.clock.now() + answer.booked_in_s


def calls_by_name(calls: list[tuple[str, str, int]]) -> dict[str, tuple[str, int]]:
    return {waiter: (tenant, tokens) for waiter, tenant, tokens in calls}


async def test_backlogged_tenants_get_tokens_by_weight(h: Harness) -> None:
    """After the first minute, the tokens each tenant is admitted are within 5 % of 1:2:5,
    every 60 s window, and the quota is used in full. Once tenant a goes idle (its last
    call admitted), b and c share in their own ratio, 2:5, from the next admission on."""
    served = await backlog(h, 300.0, a_stops_at=180.0)
    for window in (60.0, 90.0, 120.0):
        tokens = shares(served, window)
        total = sum(tokens.values())
        assert total == pytest.approx(60_000, rel=0.05)  # the quota, all of it
        for tenant, weight in (("a", 1), ("b", 2), ("c", 5)):
            assert tokens[tenant] / total == pytest.approx(weight / 8, rel=0.05), (window, tokens)
    # a's four calls waiting at 180 s are served at its share: 400 tokens at 125 a second
    idle = max(at for at, tenant, _ in served if tenant == "a")
    assert idle == pytest.approx(180.0 + 400 / 125, abs=1.0)
    tokens = shares(served, idle + 1e-6)
    assert tokens["a"] == 0
    assert sum(tokens.values()) == pytest.approx(60_000, rel=0.05)
    assert tokens["b"] / (tokens["b"] + tokens["c"]) == pytest.approx(2 / 7, rel=0.05), tokens


async def test_a_tenant_coming_to_a_busy_quota_starts_at_its_class_virtual_time(
    h: Harness,
) -> None:
    """An idle tenant banks no credit: each booked slot used moves its class's virtual time
    to the tag of the call that used it, and a tenant's first call starts from there."""
    await spend_the_burst(h)
    slots = {waiter: await book(h, waiter, "c") for waiter in ("c1", "c2")}  # tags 200, 400
    standing, tokens = TENANTS["c"]
    for waiter in ("c1", "c2"):
        h.clock.advance(slots[waiter] - h.clock.now())
        answer = await h.admit(TPM, waiter=waiter, est_tokens=tokens, standing=standing, **WITHIN)
        assert isinstance(answer, Grant)
    await book(h, "b1", "b")
    assert h.tags["b1"] == pytest.approx(400 + 300 / 2)  # not 150
