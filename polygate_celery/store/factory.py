"""Store layer: the store a configuration asks for."""

from __future__ import annotations

from polygate_celery.clock import Clock
from polygate_celery.config.models import StoreConfig
from polygate_celery.store.base import Store
from polygate_celery.store.memory import MemoryStore
from polygate_celery.store.redis import RedisStore


def store_from_config(config: StoreConfig, clock: Clock | None = None) -> Store:
    """A `RedisStore` when `redis_url` is set, else a `MemoryStore` (one process only).

    `clock` is for tests: the Redis store then passes its time to the scripts
    instead of reading Redis ``TIME``.
    """
    if config.redis_url is None:
        return MemoryStore(clock)
    return RedisStore.from_url(
        config.redis_url.get_secret_value(),
        socket_timeout_s=config.socket_timeout_s,
        connect_timeout_s=config.connect_timeout_s,
        prefix=config.key_prefix,
        lease_s=config.lease_s,
        clock=clock,
    )
