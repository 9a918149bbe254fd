"""What is particular to the Redis store: its key layout, client discipline and failures."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from polygate_celery import GovernanceBackendError
from polygate_celery.core.breaker import Effect
from polygate_celery.core.standing import Standing, TenantCaps, named_for
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store import AdmitRequest, Denial, Grant, Settlement
from polygate_celery.store.redis import KeySpace, RedisStore
from tests.redis_server import RedisServer, free_port

TERMS = SourceTerms("a", 2, quota=QuotaTerms("shared", rpm=60))


def test_every_key_of_a_prefix_sits_in_one_cluster_slot() -> None:
    keys = KeySpace("polygate")
    names = [
        keys.permits("a"),
        keys.state("a"),
        keys.quota("q"),
        keys.quota(None),
        keys.quota_log("q"),
        keys.quota_log(None),
        keys.progress("s"),
        keys.permits("other"),
        keys.queue("a"),
        keys.alive("a"),
        keys.tenant_permits("a", "customer:42"),
        keys.tenant_rate("a", "customer:42"),
        keys.wake + "origin",
    ]
    assert len({key_slot(name.encode()) for name in names}) == 1
    assert all(name.startswith("{polygate}:v1:") for name in names)


def test_a_prefix_that_would_break_the_hash_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid key prefix"):
        KeySpace("a}b")


def test_the_client_has_no_hidden_retries_and_explicit_timeouts() -> None:
    store = RedisStore.from_url("redis://127.0.0.1:1/0", socket_timeout_s=1.5)
    kwargs = store.client.connection_pool.connection_kwargs
    assert kwargs["retry"].get_retries() == 0
    assert kwargs["socket_timeout"] == 1.5
    assert kwargs["socket_connect_timeout"] == 2.0


async def test_an_unreachable_redis_fails_closed_at_once() -> None:
    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    with pytest.raises(GovernanceBackendError) as caught:
        await store.admit(AdmitRequest("s", (TERMS,), "p"))
    assert time.monotonic() - started < 1.0
    assert caught.value.__cause__ is not None
    await store.aclose()


async def test_a_wrong_type_key_is_a_backend_error_with_its_cause(
    redis_url: str, fleet_prefix: str
) -> None:
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix)
    await store.client.set(store.keys.permits("a"), "not a sorted set")
    with pytest.raises(GovernanceBackendError, match="WRONGTYPE") as caught:
        await store.admit(AdmitRequest("s", (TERMS,), "p"))
    assert caught.value.__cause__ is not None
    await store.aclose()


async def test_keys_expire_or_stay_bounded(redis_url: str, fleet_prefix: str) -> None:
    """Progress keys carry the 3,600 s TTL; the permits set empties when nothing is held."""
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix)
    await store.mark_progress("s")
    assert 3590 <= await store.client.ttl(store.keys.progress("s")) <= 3600
    grant = await store.admit(AdmitRequest("s", (TERMS,), "p"))
    assert isinstance(grant, Grant)
    assert await store.client.zcard(store.keys.permits("a")) == 1
    await store.settle(Settlement("s", TERMS, grant.permit_id, grant.admitted_at, Effect.SUCCESS))
    assert await store.client.exists(store.keys.permits("a")) == 0
    await store.aclose()


async def test_an_expired_lease_is_not_revived_by_a_renewal(
    redis_url: str, fleet_prefix: str
) -> None:
    from polygate_celery.testing import VirtualClock  # noqa: PLC0415

    clock = VirtualClock()
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix, lease_s=1.0, clock=clock)
    grant = await store.admit(AdmitRequest("s", (TERMS,), "p"))
    clock.advance(2.0)
    assert await store.renew([(TERMS, "p", 1.0)]) == [False]
    assert await store.client.zscore(store.keys.permits("a"), "p") is None
    assert grant is not None
    await store.aclose()


async def test_a_capped_tenants_place_lapses_with_its_holders_lease(
    redis_url: str, fleet_prefix: str
) -> None:
    """A holder that died (never settled, never renewed) frees its tenant's place when its
    lease ends; the tenant's record of its permits expires on its own."""
    from polygate_celery.testing import VirtualClock  # noqa: PLC0415

    clock = VirtualClock()
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix, lease_s=1.0, clock=clock)
    capped = Standing(tenant="t", caps=TenantCaps(max_concurrency=1))
    assert isinstance(await store.admit(AdmitRequest("s", (TERMS,), "p1", standing=capped)), Grant)
    refused = await store.admit(AdmitRequest("s", (TERMS,), "p2", standing=capped))
    assert isinstance(refused, Denial)
    assert refused.blocked == (("a", "tenant_cap"),)
    clock.advance(1.1)
    assert isinstance(await store.admit(AdmitRequest("s", (TERMS,), "p3", standing=capped)), Grant)
    permits = store.keys.tenant_permits("a", "t")
    assert await store.client.zrange(permits, 0, -1) == ["p3"]
    assert 0 < await store.client.ttl(permits) <= 2 * 86400
    await store.aclose()


async def test_tenants_that_come_and_go_leave_the_sources_state_bounded(
    redis_url: str, fleet_prefix: str
) -> None:
    """300 tenants (customer ids) each wait once at a source and are served: their last
    tags, which the class's virtual time has passed, are swept from its state hash."""
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix)
    source = SourceTerms("one", 1)
    holder = await store.admit(AdmitRequest("s", (source,), "first"))
    for i in range(300):
        standing = Standing(tenant=f"customer-{i}")
        call = named_for(f"call-{i}", standing.tenant)
        asks = [
            AdmitRequest(
                "s",
                (source,),
                named_for(f"p{i}-{k}", standing.tenant),
                10,
                call_id=call,
                claim_s=30.0,
                standing=standing,
            )
            for k in (0, 1)
        ]
        assert isinstance(await store.admit(asks[0]), Denial)  # it waits: its tag is kept
        assert isinstance(holder, Grant)
        await store.settle(
            Settlement("s", source, holder.permit_id, holder.admitted_at, Effect.SUCCESS)
        )
        holder = await store.admit(asks[1])  # handed the permit: served
    fields = await store.client.hkeys(store.keys.state("one"))
    assert len(fields) <= 64 + 2, sorted(fields)
    assert "ff0:customer-299" in fields  # (the last one's tag: its class has not moved on)
    await store.aclose()


async def test_a_caller_booking_a_slot_passes_over_a_waiters_claim_among_the_bookings(
    redis_url: str, fleet_prefix: str
) -> None:
    """A source's alive set holds the claims of calls waiting for its permits beside the
    quota slots booked there: a caller that may take a booked slot reads only the latter
    (a claim read as a booking failed the admission)."""
    from polygate_celery.testing import VirtualClock  # noqa: PLC0415

    clock = VirtualClock()
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix, lease_s=1.0, clock=clock)
    terms = SourceTerms("q", 1, quota=QuotaTerms("source:q", tpm=6000))
    # the permit held by a call that spends the bucket's burst, then dies
    assert isinstance(await store.admit(AdmitRequest("s", (terms,), "h", 6000)), Grant)
    waiter = AdmitRequest("s", (terms,), "w-1", call_id="w", claim_s=30.0)  # no tokens
    refused = await store.admit(waiter)
    assert isinstance(refused, Denial)
    assert refused.blocked == (("q", "at_capacity"),)  # queued: its claim in the alive set
    clock.advance(1.5)  # the holder's lease lapsed: the quota alone refuses the next caller
    caller = AdmitRequest(
        "s", (terms,), "c-1", 200, call_id="c", claim_s=3.0, book_within_s=300.0,
        standing=Standing(tenant="t"),
    )  # fmt: skip
    booked = await store.admit(caller)
    assert isinstance(booked, Denial)
    assert booked.booked_in_s is not None
    await store.aclose()


async def test_a_connection_the_server_closed_is_replaced_before_the_next_call(
    fleet_prefix: str,
) -> None:
    """admit and settle keep their connections between calls (as the pool would). On a
    private server: killing every client of a shared one would cut tests running beside."""
    with RedisServer() as server:
        store = RedisStore.from_url(server.url, prefix=fleet_prefix)
        grant = await store.admit(AdmitRequest("s", (TERMS,), "p"))
        assert isinstance(grant, Grant)
        killer = Redis.from_url(server.url)
        assert await killer.client_kill_filter(_type="normal", skipme=True) >= 1
        await killer.aclose()
        await asyncio.sleep(0.5)  # the closed connection's end reaches the event loop
        settled = Settlement("s", TERMS, "p", grant.admitted_at, Effect.SUCCESS)
        assert await store.settle(settled) is True
        await store.client.script_flush()  # and the scripts are loaded again on that path
        assert isinstance(await store.admit(AdmitRequest("s", (TERMS,), "q")), Grant)
        await store.aclose()


async def test_a_hand_over_sent_before_the_waiters_process_listens_is_not_lost(
    redis_url: str, fleet_prefix: str
) -> None:
    """A process subscribes to its wake-ups when a call of its first waits. A permit
    another process hands that call before the subscription is confirmed is announced
    to nobody; once subscribed, the process wakes its queued calls to ask again."""
    one = SourceTerms("one", 1)
    waiting = RedisStore.from_url(redis_url, prefix=fleet_prefix)
    releasing = RedisStore.from_url(redis_url, prefix=fleet_prefix)
    held = await releasing.admit(AdmitRequest("s", (one,), "held"))
    assert isinstance(held, Grant)
    with waiting.watch_releases(["one"], "w") as watch:
        queue = AdmitRequest("s", (one,), "p", call_id="w", claim_s=30.0, queued=False)
        assert not isinstance(await waiting.admit(queue), Grant)  # queued; listening begins
        # at once, in the same turn of the loop: the listener has not subscribed yet
        settled = releasing.settle(Settlement("s", one, "held", held.admitted_at, Effect.SUCCESS))
        await settled
        await asyncio.wait_for(watch.wait(), 10)  # no poll here: woken by the subscription
    again = AdmitRequest("s", (one,), "p", call_id="w", claim_s=30.0)
    assert isinstance(await waiting.admit(again), Grant)
    await waiting.aclose()
    await releasing.aclose()


async def test_a_booker_in_another_process_is_told_its_slot_moved(
    redis_url: str, fleet_prefix: str
) -> None:
    """A call served before it takes a quota slot a call of another process booked: that
    booker is booked the next slot it comes to at once (the next later booker's, that one
    a new one), and each is told by a message on its process's wake-up channel, so none
    asks at its old slot to learn it; then each is admitted where it was told."""
    from polygate_celery.testing import VirtualClock  # noqa: PLC0415

    clock = VirtualClock()  # (both processes on one store clock: slots to the microsecond)
    rpm = SourceTerms("rpm", 1000, quota=QuotaTerms("source:rpm", rpm=60))
    booking = RedisStore.from_url(redis_url, prefix=fleet_prefix, clock=clock)
    taking = RedisStore.from_url(redis_url, prefix=fleet_prefix, clock=clock)
    n = 0
    while isinstance(await taking.admit(AdmitRequest("s", (rpm,), f"burst-{n}")), Grant):
        n += 1  # the bucket's burst spent
    interactive, batch = Standing(rank=0), Standing(rank=1)

    def ask(call: str, standing: Standing, arrival: int | None = None) -> AdmitRequest:
        return AdmitRequest(
            "s", (rpm,), f"p-{call}", call_id=call, claim_s=30.0, book_within_s=300.0,
            standing=standing, arrival=arrival,
        )  # fmt: skip

    slots, arrivals = {}, {}
    for call in ("b1", "b2"):
        clock.advance(0.01)
        denial = await booking.admit(ask(call, batch))
        assert isinstance(denial, Denial)
        assert denial.booked_in_s is not None
        slots[call], arrivals[call] = clock.now() + denial.booked_in_s, denial.arrival
    await booking.listening()
    watches = {call: booking.watch_releases(["rpm"], call) for call in slots}
    taken = await taking.admit(ask("i1", interactive))
    assert isinstance(taken, Denial)
    assert clock.now() + taken.booked_in_s == pytest.approx(slots["b1"])
    told = {}
    for call, watch in watches.items():
        await asyncio.wait_for(watch.wait(), 10)
        told[call] = clock.now() + watch.moved()
    assert told["b1"] == pytest.approx(slots["b2"])
    assert told["b2"] == pytest.approx(slots["b2"] + 1.0)
    clock.advance(slots["b1"] - clock.now())
    assert isinstance(await taking.admit(ask("i1", interactive, taken.arrival)), Grant)
    for call in ("b1", "b2"):
        clock.advance(told[call] - clock.now())
        assert isinstance(await booking.admit(ask(call, batch, arrivals[call])), Grant)
    for watch in watches.values():
        watch.__exit__(None, None, None)
    await booking.aclose()
    await taking.aclose()
