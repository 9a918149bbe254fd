"""A Sentinel-managed master killed mid-run: calls fail closed, then recover on the promoted
replica without a restart; the cap holds throughout; wake-ups follow the new master."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from polygate_celery import GovernanceBackendError
from polygate_celery.config.models import StoreConfig
from polygate_celery.core.breaker import Effect
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store import AdmitRequest, Grant, Settlement
from polygate_celery.store.redis import RedisStore
from tests.conftest import Figures, unique_prefix
from tests.integration.failover_load import assert_failover, run_failover
from tests.redis_topologies import SentinelGroup


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


def sentinel_config(group: SentinelGroup) -> StoreConfig:
    return StoreConfig(
        sentinels=group.sentinels, service_name=group.service, key_prefix=unique_prefix()
    )


@pytest.mark.timeout(300)
async def test_master_killed_mid_run(group: SentinelGroup, figures: Figures) -> None:
    run = await run_failover(
        sentinel_config(group), lambda _: group.kill_master(), group.wait_for_promotion
    )
    figures(f"sentinel failover: {assert_failover(run)}")


ONE = SourceTerms("one", max_concurrency=1)


async def test_wake_ups_follow_the_new_master(group: SentinelGroup) -> None:
    """A process waiting before the failover is woken by a release on the new master (its
    listener subscribes again there), not only by its poll."""
    config = sentinel_config(group)
    holder, waiter = RedisStore.from_config(config), RedisStore.from_config(config)
    try:
        master = group.master()
        await wait_on(holder, waiter, "before", lambda: subscribed(master, waiter.keys.wake))
        old = await asyncio.to_thread(group.kill_master)
        new = await asyncio.to_thread(group.wait_for_promotion, old)
        await recovered(holder, waiter)
        # Permits the dead master's holder had are in the replica's copy: start afresh.
        await asyncio.to_thread(flush, new, holder.keys.pattern)
        await wait_on(holder, waiter, "after", lambda: subscribed(new, waiter.keys.wake))
    finally:
        await holder.aclose()
        await waiter.aclose()


async def wait_on(
    holder: RedisStore, waiter: RedisStore, tag: str, listening: Callable[[], bool]
) -> None:
    """`holder` takes ONE's permit, `waiter` queues for it (and listens: `listening()`
    says when its subscription is live), `holder` releases: the waiter is woken (handed
    the permit) within 10 s, far inside its poll claim of 60 s."""
    grant = await admit(holder, f"{tag}-h", "")
    assert isinstance(grant, Grant)
    with waiter.watch_releases([ONE.name], f"{tag}-w") as watch:
        assert not isinstance(await admit(waiter, f"{tag}-w", f"{tag}-w"), Grant)
        await until(listening, "the waiter's listener to subscribe")
        await holder.settle(
            Settlement(
                scope="s",
                source=ONE,
                permit_id=grant.permit_id,
                admitted_at=grant.admitted_at,
                effect=Effect.SUCCESS,
            )
        )
        await asyncio.wait_for(watch.wait(), 10)
    assert isinstance(await admit(waiter, f"{tag}-w", f"{tag}-w"), Grant)  # handed to it


async def recovered(*stores: RedisStore, within_s: float = 30.0) -> None:
    """Wait until each store answers again (its first calls after a failover may meet
    connections to the dead master, and fail closed)."""
    deadline = time.monotonic() + within_s
    for store in stores:
        while True:
            try:
                await store.gate_closed_for_s("s")
                break
            except GovernanceBackendError:
                assert time.monotonic() < deadline, "the store did not recover"
                await asyncio.sleep(0.2)


async def until(condition: Callable[[], bool], what: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"{what}: not within {within_s:g} s"
        await asyncio.sleep(0.1)


async def admit(store: RedisStore, permit: str, call: str) -> object:
    request = AdmitRequest("s", (ONE,), permit, call_id=call, claim_s=60.0 if call else 0.0)
    return await store.admit(request)


def subscribed(port: int, prefix: str) -> bool:
    with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as client:
        return bool(client.pubsub_channels(f"{prefix}*"))


def flush(port: int, pattern: str) -> None:
    with redis.Redis(port=port, socket_timeout=1) as client:
        for key in client.scan_iter(match=pattern):
            client.delete(key)
