"""The store contract suite, re-run on a Redis topology (Sentinel, Cluster).

A test module imports every contract test (`CONTRACT`) and the fixtures below,
and defines `topology_config`: the `StoreConfig` of its topology. Each Redis
store gets its own key prefix and its keys are removed afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
import redis

from polygate_celery.config.models import StoreConfig
from polygate_celery.store import Store
from polygate_celery.store.redis import RedisStore
from polygate_celery.testing import VirtualClock
from tests.conftest import unique_prefix
from tests.unit.store.conftest import Harness

StoreFactory = Callable[[VirtualClock], Store]


async def remove_keys(store: RedisStore, attempts: int = 20) -> None:
    """Every key of the store's prefix, on every master (a cluster spreads them); retried
    while a client that saw a failover learns the new topology."""
    client = store.client
    for attempt in range(attempts):
        try:
            keys = [key async for key in client.scan_iter(match=store.keys.pattern)]
            for key in keys:
                await client.delete(key)  # one by one: on a cluster they may be in many slots
            return
        except (redis.RedisError, OSError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)


def contract_fixtures(name: str) -> tuple[object, object, object]:
    """The `store_factory`, `store` and `h` fixtures of a topology named `name`."""

    @pytest_asyncio.fixture(params=[name])
    async def store_factory(topology_config: StoreConfig) -> AsyncIterator[StoreFactory]:
        made: list[RedisStore] = []

        def build(clock: VirtualClock) -> Store:
            config = topology_config.model_copy(update={"key_prefix": unique_prefix()})
            store = RedisStore.from_config(config, clock=clock)
            made.append(store)
            return store

        yield build
        for store in made:
            await remove_keys(store)
            await store.aclose()

    @pytest.fixture
    def store(store_factory: StoreFactory, clock: VirtualClock) -> Store:
        return store_factory(clock)

    @pytest.fixture
    def h(store: Store, clock: VirtualClock) -> Harness:
        return Harness(store, clock)

    return store_factory, store, h
