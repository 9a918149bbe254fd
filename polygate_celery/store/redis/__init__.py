"""Store layer (Redis): fleet-wide governance state, one Lua script per operation."""

from polygate_celery.store.redis.keys import SCHEMA_VERSION, KeySpace
from polygate_celery.store.redis.store import RedisStore, redis_client

__all__ = ["SCHEMA_VERSION", "KeySpace", "RedisStore", "redis_client"]
