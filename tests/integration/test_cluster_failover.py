"""A Redis Cluster master killed mid-run: calls fail closed, then recover once its replica
is promoted, without a restart; the cap holds; wake-ups follow; a cold client under
concurrent first calls works."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import key_slot

from polygate_celery.config.models import StoreConfig
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store import AdmitRequest, Grant
from polygate_celery.store.redis import RedisStore
from tests.conftest import Figures, unique_prefix
from tests.integration.failover_load import assert_failover, run_failover
from tests.integration.test_sentinel_failover import ONE, recovered, wait_on
from tests.integration.topology_contract import remove_keys
from tests.redis_topologies import RedisClusterGroup

# redis-py drops the ClusterNode of a replica it saw promoted without closing it; its
# garbage warns. Collected at each test's end (below), where this filter applies.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function ClusterNode.__del__"
    ":pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture
def cluster() -> Iterator[RedisClusterGroup]:
    with RedisClusterGroup() as cluster:
        yield cluster
    gc.collect()


def cluster_config(cluster: RedisClusterGroup) -> StoreConfig:
    return StoreConfig(cluster_nodes=cluster.nodes, key_prefix=unique_prefix())


def slot(key: str) -> int:
    return key_slot(key.encode())


@pytest.mark.timeout(300)
async def test_master_killed_mid_run(cluster: RedisClusterGroup, figures: Figures) -> None:
    def kill(store: RedisStore) -> tuple[int, int]:
        permits = slot(store.keys.permits("w"))  # the scope's governance group's slot
        return cluster.kill_master_of(permits), permits

    run = await run_failover(
        cluster_config(cluster), kill, lambda killed: cluster.wait_for_promotion(*killed)
    )
    figures(f"cluster failover: {assert_failover(run)}")


async def test_wake_ups_follow_the_new_master(cluster: RedisClusterGroup) -> None:
    """A waiting process listens on one node; the master it listens on (or, when that is
    a replica, the master of the keys) is killed; after the promotion a release still
    wakes it at once: it subscribes again on another live node."""
    config = cluster_config(cluster)
    holder, waiter = RedisStore.from_config(config), RedisStore.from_config(config)
    try:
        await wait_on(holder, waiter, "before", lambda: subscribed(cluster, waiter.keys.wake))
        # Kill the node the waiter listens on, or else the master of the keys' slot.
        port = listener_port(cluster, waiter.keys.wake)
        keys = slot(holder.keys.permits(ONE.name))
        if port in cluster.masters():
            keys = next(s for s, _ in cluster.masters()[port])
        old = await asyncio.to_thread(cluster.kill_master_of, keys)
        await asyncio.to_thread(cluster.wait_for_promotion, old, keys)
        await recovered(holder, waiter)
        await remove_keys(holder)  # the holder's permit of "before" may survive the failover
        await wait_on(holder, waiter, "after", lambda: subscribed(cluster, waiter.keys.wake))
    finally:
        await holder.aclose()
        await waiter.aclose()


def listener_port(cluster: RedisClusterGroup, prefix: str) -> int | None:
    """The live node with a subscriber of a channel starting with `prefix` (each node
    knows its own subscribers; a PUBLISH reaches every node)."""
    for port in cluster.processes:
        with redis.Redis(port=port, socket_timeout=1, decode_responses=True) as client:
            if client.pubsub_channels(f"{prefix}*"):
                return port
    return None


def subscribed(cluster: RedisClusterGroup, prefix: str) -> bool:
    return listener_port(cluster, prefix) is not None


async def test_a_cold_client_takes_concurrent_first_calls(cluster: RedisClusterGroup) -> None:
    """Many first calls at once on a new store: each is answered (a cold cluster client
    learns its slot table once, before the first command, not once per caller)."""
    source = SourceTerms("busy", max_concurrency=1000)
    for trial in range(10):
        store = RedisStore.from_config(cluster_config(cluster))
        try:
            replies = await asyncio.gather(
                *(
                    store.admit(AdmitRequest("s", (source,), f"p{i}", call_id=f"c{i}", claim_s=3))
                    for i in range(50)
                ),
                return_exceptions=True,
            )
            failed = [r for r in replies if not isinstance(r, Grant)]
            assert not failed, f"trial {trial}: {failed[:3]}"
        finally:
            await remove_keys(store)
            await store.aclose()
    assert ONE.max_concurrency == 1
