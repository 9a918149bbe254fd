"""Store layer (Redis): fleet-wide governance state, one Lua script per operation."""

from polygate_celery.store.redis.connect import (
    blocking_governance_client,
    eviction_policies,
    governance_client,
    redis_client,
    sync_redis_client,
)
from polygate_celery.store.redis.errors import translated
from polygate_celery.store.redis.groups import Groups, governance_groups
from polygate_celery.store.redis.keys import SCHEMA_VERSION, KeySpace
from polygate_celery.store.redis.store import LuaScript, RedisStore, lua_text, run_script

__all__ = [
    "SCHEMA_VERSION",
    "Groups",
    "KeySpace",
    "LuaScript",
    "RedisStore",
    "blocking_governance_client",
    "eviction_policies",
    "governance_client",
    "governance_groups",
    "lua_text",
    "redis_client",
    "run_script",
    "sync_redis_client",
    "translated",
]
