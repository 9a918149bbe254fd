"""Store layer: the store a configuration asks for."""

from __future__ import annotations

from polygate_celery.clock import Clock
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.models import StoreConfig
from polygate_celery.store.base import Store
from polygate_celery.store.memory import MemoryStore
from polygate_celery.store.redis import RedisStore


def store_from_config(
    config: StoreConfig, clock: Clock | None = None, *, groups_of: GatewayConfig | None = None
) -> Store:
    """A `RedisStore` when the configuration names a Redis (`redis_url`, `sentinels` or
    `cluster_nodes`), else a `MemoryStore` (one process only).

    `clock` is for tests: the Redis store then passes its time to the scripts
    instead of reading Redis ``TIME``. `groups_of` is the whole configuration, whose
    governance groups spread a cluster's keys over hash tags (keys.py).
    """
    if not config.shared:
        return MemoryStore(clock)
    return RedisStore.from_config(config, clock=clock, groups_of=groups_of)
