"""Store contract: a tenant's caps at a source, fleet-wide (SPEC §8).

A tenant may be capped at each source its calls go to: calls in flight
(`max_concurrency`), requests and tokens per minute (`rpm`, `tpm`, buckets as a
source's own quota). A call over one is refused there for `tenant_cap`, with the
seconds until its buckets admit it (none known while its calls in flight must end
first); another source, or another tenant, is not held back. Settling frees the
tenant's place and counts its tokens as used.
"""

from __future__ import annotations

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.standing import Standing, TenantCaps, named_for
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store import Denial, Grant, TenantSnapshot
from tests.unit.store.conftest import Harness

SRC = SourceTerms("src", 8)
OTHER = SourceTerms("other", 8)


def tenant(name: str, **caps: int) -> Standing:
    return Standing(tenant=name, caps=TenantCaps(**caps) if caps else None)


class Bucket:
    """A per-minute bucket as a provider counts one (a minute's burst): every admission
    the store makes must fit it."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.tat = 0.0

    def takes(self, now: float, units: int) -> None:
        refill = 60.0 / self.per_minute
        over = max(self.tat - now, 0.0) + units * refill - 60.0
        assert over <= 1e-6, f"{units} at {now:.3f} s go {over:.3f} s over the cap"
        self.tat = max(self.tat, now) + units * refill


async def test_a_tenant_at_its_concurrency_cap_is_refused_until_one_of_its_calls_ends(
    h: Harness,
) -> None:
    capped = tenant("t", max_concurrency=2)
    first = await h.grant(SRC, standing=capped)
    await h.grant(SRC, standing=capped)
    denial = await h.deny(SRC, standing=capped)
    assert denial.blocked == (("src", "tenant_cap"),)
    assert denial.reopen_in_s is None  # a call in flight must end first: not known
    assert isinstance(await h.admit(SRC, standing=tenant("u", max_concurrency=2)), Grant)
    assert isinstance(await h.admit(SRC), Grant)  # a call of no tenant: no cap
    assert await h.settle(first, SRC, standing=capped)
    assert isinstance(await h.admit(SRC, standing=capped), Grant)
    assert (await h.snapshot(SRC)).permits_in_use == 4


async def test_the_caps_hold_at_each_source_the_call_may_go_to(h: Harness) -> None:
    capped = tenant("t", max_concurrency=1)
    assert (await h.grant(SRC, OTHER, standing=capped)).source == "src"
    assert (await h.grant(SRC, OTHER, standing=capped)).source == "other"
    denial = await h.deny(SRC, OTHER, standing=capped)
    assert denial.blocked == (("src", "tenant_cap"), ("other", "tenant_cap"))


async def test_a_repeated_admission_of_a_capped_tenant_returns_its_first_grant(
    h: Harness,
) -> None:
    capped = tenant("t", max_concurrency=1)
    first = await h.grant(SRC, standing=capped, permit_id="p")
    again = await h.grant(SRC, standing=capped, permit_id="p")
    assert (again.source, again.permit_id) == (first.source, "p")
    assert (await h.snapshot(SRC)).permits_in_use == 1


async def test_a_tenants_rpm_is_a_bucket_at_each_source(h: Harness) -> None:
    capped = tenant("t", rpm=60)
    provider = Bucket(60)
    granted = 0
    while isinstance(answer := await h.admit(SRC, standing=capped), Grant):
        provider.takes(h.clock.now(), 1)
        await h.settle(answer, SRC, standing=capped)
        granted += 1
    assert granted == 59  # a minute's burst, less the arrival margin
    assert answer.blocked == (("src", "tenant_cap"),)
    assert answer.reopen_in_s == pytest.approx(0.5)
    assert isinstance(await h.admit(SRC, standing=tenant("u", rpm=60)), Grant)
    assert isinstance(await h.admit(OTHER, standing=capped), Grant)  # its own bucket there
    for _ in range(120):  # then one a second, never over
        h.clock.advance(0.5)
        answer = await h.admit(SRC, standing=capped)
        if isinstance(answer, Grant):
            provider.takes(h.clock.now(), 1)
            await h.settle(answer, SRC, standing=capped)
            granted += 1
    assert granted == 59 + 60


async def test_a_tenants_tpm_counts_the_tokens_used(h: Harness) -> None:
    capped = tenant("t", tpm=6000)  # 100 tokens a second
    grants = []
    while isinstance(answer := await h.admit(SRC, standing=capped, est_tokens=1000), Grant):
        grants.append(answer)
    assert len(grants) == 5
    assert answer.blocked == (("src", "tenant_cap"),)
    assert answer.reopen_in_s == pytest.approx(0.5)
    assert isinstance(await h.admit(SRC, standing=capped, est_tokens=0), Grant)  # no tokens
    # one used 100 of its 1,000: the other 900 are the tenant's again
    # (room for 950 tokens was left: now 1,850)
    await h.settle(grants[0], SRC, standing=capped, est_tokens=1000, used_tokens=100)
    assert isinstance(await h.admit(SRC, standing=capped, est_tokens=1800), Grant)
    assert isinstance(await h.deny(SRC, standing=capped, est_tokens=100), Denial)


async def test_a_permit_handed_to_a_waiter_whose_tenant_reached_its_cap_goes_on(
    h: Harness,
) -> None:
    source = SourceTerms("src", 3)
    t = tenant("t", max_concurrency=2)
    held_t = await h.grant(source, standing=t)
    held_u = [await h.grant(source, standing=tenant("u")) for _ in range(2)]
    # two of t's calls and one of v's wait, in that order (t has one in flight: room)
    for waiter, standing, tokens in (("w0", t, 1), ("w1", t, 1), ("w2", tenant("v"), 1000)):
        denial = await h.deny(source, waiter=waiter, standing=standing, est_tokens=tokens)
        assert denial.blocked == (("src", "at_capacity"),)
    for grant in held_u:
        await h.settle(grant, source, standing=tenant("u"))  # handed to w0, then w1
    assert isinstance(await h.admit(source, waiter="w0", standing=t, est_tokens=1), Grant)
    # w1's tenant is at its cap now: its permit goes on to w2, held for it
    denial = await h.deny(source, waiter="w1", standing=t, est_tokens=1)
    assert denial.blocked == (("src", "tenant_cap"),)
    assert (await h.deny(source, standing=tenant("x"))).blocked == (("src", "at_capacity"),)
    handed = await h.admit(source, waiter="w2", standing=tenant("v"), est_tokens=1000)
    assert isinstance(handed, Grant)
    assert held_t.source == handed.source == "src"


async def test_a_snapshot_counts_each_tenants_calls_at_a_source_by_their_ids(
    h: Harness,
) -> None:
    source = SourceTerms("src", 2)
    await h.grant(source, permit_id=named_for("p1", "acme"))
    await h.grant(source, permit_id=named_for("p2", "beta"))
    for waiter, name in (("w1", "acme"), ("w2", "acme"), ("w3", "beta"), ("w4", "")):
        await h.deny(source, waiter=named_for(waiter, name))
    assert (await h.snapshot(source)).tenants == (
        TenantSnapshot("acme", in_flight=1, waiting=2),
        TenantSnapshot("beta", in_flight=1, waiting=1),
    )
    quota = SourceTerms("q", 8, quota=QuotaTerms("source:q", rpm=60))
    while isinstance(answer := await h.admit(quota), Grant):
        await h.settle(answer, quota)
    booking = await h.deny(quota, waiter=named_for("w5", "acme"), book_within_s=300.0)
    assert booking.booked_in_s is not None
    assert (await h.snapshot(quota)).tenants == (TenantSnapshot("acme", booked=1),)


async def test_a_capped_waiters_permit_is_not_handed_on_where_the_source_has_no_room(
    h: Harness,
) -> None:
    """Its source's limit fell since the hand-over (a 429): the permit is not passed to the
    next waiter, who keeps its place in the queue."""
    source = SourceTerms("src", 4)
    t = Standing(tenant="t", weight=100.0, caps=TenantCaps(max_concurrency=2))  # served first
    a = await h.grant(source, standing=t)
    held = [await h.grant(source, standing=tenant("u")) for _ in range(3)]
    for waiter, standing, tokens in (("w0", t, 10), ("w1", t, 10), ("w2", tenant("v"), 10)):
        denial = await h.deny(source, waiter=waiter, standing=standing, est_tokens=tokens)
        assert denial.blocked == (("src", "at_capacity"),)
    for grant in held[:2]:
        await h.settle(grant, source, standing=tenant("u"))  # handed to w0, then w1
    assert isinstance(await h.admit(source, waiter="w0", standing=t, est_tokens=10), Grant)
    await h.settle(held[2], source, Effect.NEUTRAL, congested=True)  # the limit: 4 -> 2
    denial = await h.deny(source, waiter="w1", standing=t, est_tokens=10)
    assert denial.blocked == (("src", "at_capacity"),)  # and its tenant at its cap
    denial = await h.deny(source, waiter="w2", standing=tenant("v"), est_tokens=10)
    assert denial.blocked == (("src", "at_capacity"),)  # nothing handed to it: no room
    await h.settle(a, source, Effect.NEUTRAL, standing=t)  # room for one: w2's, before w3
    denial = await h.deny(source, waiter="w3", standing=tenant("w"), est_tokens=20)
    assert denial.blocked == (("src", "at_capacity"),)
    handed = await h.admit(source, waiter="w2", standing=tenant("v"), est_tokens=10)
    assert isinstance(handed, Grant)
