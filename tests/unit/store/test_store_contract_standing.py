"""Store contract: who is served first among the calls waiting at a source (SPEC §8).

A released permit goes to the waiter of the highest class; within a class, to the
tenant furthest behind its weighted share of tokens (`core.standing`); a class
below its floor (`min_share` of the recent grants) goes before the higher ones.
With one class and no tenant, the queue is first come, first served.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter

import pytest

from polygate_celery.core.standing import Standing
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store import Grant
from tests.unit.store.conftest import Harness

ONE = SourceTerms("one", max_concurrency=1)
CLAIM_S = 60.0
INTERACTIVE = Standing(rank=0)
BATCH = Standing(rank=1)


async def queue(h: Harness, waiter: str, standing: Standing, est_tokens: int = 0) -> None:
    await h.deny(ONE, waiter=waiter, claim_s=CLAIM_S, standing=standing, est_tokens=est_tokens)


async def serve(h: Harness, held: Grant, waiting: list[str]) -> tuple[str, Grant]:
    """Settle `held`; the waiter it was handed to, and that waiter's grant."""
    with contextlib.ExitStack() as stack:
        watches = {w: stack.enter_context(h.store.watch_releases(["one"], w)) for w in waiting}
        await h.settle(held, ONE)
        await h.turns()
        woken = [w for w, watch in watches.items() if watch.woken_by == "one"]
    assert len(woken) == 1, woken
    waiting.remove(woken[0])
    return woken[0], await h.grant(ONE, waiter=woken[0], claim_s=CLAIM_S)


async def serve_all(h: Harness, held: Grant, waiting: list[str], n: int) -> tuple[list[str], Grant]:
    """The next `n` waiters served, in order, and the permit the last one holds."""
    order = []
    for _ in range(n):
        name, held = await serve(h, held, waiting)
        order.append(name)
    return order, held


async def test_one_class_and_no_tenant_is_first_come_first_served(h: Harness) -> None:
    held = await h.grant(ONE)
    waiting = [f"w{i}" for i in range(5)]
    for w in waiting:
        await queue(h, w, Standing(), est_tokens=100 - 10 * len(w))
    order, _ = await serve_all(h, held, list(waiting), 5)
    assert order == waiting


async def test_a_higher_class_is_served_first_whenever_it_came(h: Harness) -> None:
    held = await h.grant(ONE)
    for i in range(3):
        await queue(h, f"batch{i}", BATCH)
    await queue(h, "urgent0", INTERACTIVE)
    await queue(h, "urgent1", INTERACTIVE)
    waiting = ["batch0", "batch1", "batch2", "urgent0", "urgent1"]
    order, _ = await serve_all(h, held, waiting, 5)
    assert order == ["urgent0", "urgent1", "batch0", "batch1", "batch2"]


async def test_backlogged_tenants_share_tokens_by_weight(h: Harness) -> None:
    """Tenants weighted 1:3 with equal calls: the first eight served are two and six."""
    held = await h.grant(ONE)
    waiting = []
    for i in range(8):
        for tenant, weight in (("a", 1.0), ("b", 3.0)):
            name = f"{tenant}{i}"
            await queue(h, name, Standing(tenant=tenant, weight=weight), est_tokens=100)
            waiting.append(name)
    order, _ = await serve_all(h, held, waiting, 8)
    assert Counter(name[0] for name in order) == {"a": 2, "b": 6}


async def test_shares_are_counted_in_tokens_not_calls(h: Harness) -> None:
    """Equal weights, calls of 100 and 300 tokens: three small calls per large one."""
    held = await h.grant(ONE)
    waiting = []
    for i in range(8):
        for tenant, tokens in (("s", 100), ("l", 300)):
            name = f"{tenant}{i}"
            await queue(h, name, Standing(tenant=tenant), est_tokens=tokens)
            waiting.append(name)
    order, _ = await serve_all(h, held, waiting, 8)
    assert Counter(name[0] for name in order) == {"s": 6, "l": 2}


async def test_an_idle_tenant_banks_no_credit(h: Harness) -> None:
    """A tenant that waited for nothing while another was served starts level with it,
    not ahead by what it did not use."""
    held = await h.grant(ONE)
    busy = [f"b{i}" for i in range(6)]
    for name in busy:
        await queue(h, name, Standing(tenant="b"), est_tokens=100)
    served, held = await serve_all(h, held, busy, 4)
    assert served == ["b0", "b1", "b2", "b3"]
    waiting = list(busy)
    for i in range(4):
        await queue(h, f"a{i}", Standing(tenant="a"), est_tokens=100)
        waiting.append(f"a{i}")
    order, _ = await serve_all(h, held, waiting, 4)
    assert Counter(name[0] for name in order) == {"a": 2, "b": 2}


async def test_a_class_below_its_floor_is_served_before_higher_ones(h: Harness) -> None:
    floors = (0.0, 0.25)
    held = await h.grant(ONE)
    waiting = []
    for i in range(40):
        for prefix, rank in (("i", 0), ("b", 1)):
            name = f"{prefix}{i}"
            await queue(h, name, Standing(rank=rank, floors=floors))
            waiting.append(name)
    order, _ = await serve_all(h, held, waiting, 40)
    batch = sum(1 for name in order if name[0] == "b")
    assert 8 <= batch <= 12, order  # a quarter of 40, give or take the counters' start
    assert [n for n in order if n[0] == "b"] == [f"b{i}" for i in range(batch)]  # in order


async def test_without_a_floor_a_lower_class_waits_for_the_higher_one(h: Harness) -> None:
    held = await h.grant(ONE)
    waiting = []
    for i in range(6):
        for prefix, rank in (("i", 0), ("b", 1)):
            await queue(h, f"{prefix}{i}", Standing(rank=rank))
            waiting.append(f"{prefix}{i}")
    order, _ = await serve_all(h, held, waiting, 6)
    assert order == [f"i{i}" for i in range(6)]


# --- a class's own progress (its stall verdict) ----------------------------------------


async def test_a_success_marks_its_class_progress_beside_the_scopes(h: Harness) -> None:
    grant = await h.grant(ONE)
    h.clock.advance(5.0)
    await h.settle(grant, ONE, rank=0)
    h.clock.advance(2.0)
    assert await h.store.progress_age_s("s") == 2.0
    assert await h.store.progress_age_s("s", 0) == 2.0
    assert await h.store.progress_age_s("s", 1) == math.inf  # the other class: none yet
    grant = await h.grant(ONE)
    await h.settle(grant, ONE, rank=1)
    h.clock.advance(3.0)
    assert await h.store.progress_age_s("s", 0) == 5.0
    assert await h.store.progress_age_s("s", 1) == 3.0


async def test_a_success_without_a_class_marks_the_scope_alone(h: Harness) -> None:
    grant = await h.grant(ONE)
    await h.settle(grant, ONE)
    assert await h.store.progress_age_s("s") == 0.0
    assert await h.store.progress_age_s("s", 0) == math.inf


async def test_a_class_progress_marked_elsewhere_counts_too(h: Harness) -> None:
    await h.store.mark_progress("s", 1)
    h.clock.advance(1.5)
    assert await h.store.progress_age_s("s", 1) == 1.5
    assert await h.store.progress_age_s("s") == 1.5


async def test_a_snapshot_counts_the_waiters_and_recent_grants_of_each_class(
    h: Harness,
) -> None:
    assert (await h.snapshot(ONE)).waiting == ()
    held = await h.grant(ONE)
    floors = (0.0, 0.2, 0.0)
    for i in range(3):
        await queue(h, f"b{i}", Standing(rank=1, floors=floors))
    await queue(h, "i0", Standing(rank=0, floors=floors))
    snapshot = await h.snapshot(ONE)
    assert snapshot.waiting == (1, 3)
    assert snapshot.recent_grants == ()
    order, _ = await serve_all(h, held, ["i0", "b0", "b1", "b2"], 2)
    assert order == ["b0", "i0"]  # batch below its floor first, then the higher class
    snapshot = await h.snapshot(ONE)
    assert snapshot.waiting == (0, 2)
    assert snapshot.recent_grants == pytest.approx((1.0, 0.98))


async def after_a0_used(h: Harness, used_tokens: int) -> list[str]:
    """Tenants "a" and "b" of equal weight queue three calls each, estimated at 100 tokens;
    a0 is served first and settles having used `used_tokens`; then each tenant queues one
    more call. The order the six calls left are served in."""
    held = await h.grant(ONE)
    waiting = []
    for i in range(3):
        for tenant in ("a", "b"):
            await queue(h, f"{tenant}{i}", Standing(tenant=tenant), est_tokens=100)
            waiting.append(f"{tenant}{i}")
    name, granted = await serve(h, held, waiting)
    assert name == "a0"
    a = Standing(tenant="a")
    await h.settle(granted, ONE, est_tokens=100, used_tokens=used_tokens, standing=a)
    await h.turns()
    await queue(h, "a3", a, est_tokens=100)
    await queue(h, "b3", Standing(tenant="b"), est_tokens=100)
    waiting += ["a3", "b3"]
    waiting.remove("b0")  # settling a0 handed its permit on: b0 holds it now
    order, _ = await serve_all(h, await h.grant(ONE, waiter="b0", claim_s=CLAIM_S), waiting, 6)
    return order


async def test_a_tenants_share_counts_the_tokens_its_calls_used(h: Harness) -> None:
    """A call of "a" that used 1,000 tokens for an estimate of 100 moves a's place back by
    900: its next call comes after b's."""
    assert await after_a0_used(h, 1000) == ["a1", "b1", "a2", "b2", "b3", "a3"]


async def test_a_tenant_used_as_estimated_keeps_its_place(h: Harness) -> None:
    assert await after_a0_used(h, 100) == ["a1", "b1", "a2", "b2", "a3", "b3"]
