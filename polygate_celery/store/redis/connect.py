"""Store layer (Redis): the one place governance clients are made, for every topology.

A store configuration names one Redis server (`redis_url`), a master behind
Redis Sentinel (`sentinels`, `service_name`) or a Redis Cluster
(`cluster_nodes`). Each gives an asyncio client (the store's) and a blocking
one (a Celery task's run markers) with the same settings: no hidden retries,
explicit socket and connect timeouts, decoded replies, and a pool that makes a
caller wait for a free connection rather than fail.

redis-py retries connection errors and timeouts silently by default (ten times
in 8.x), which would stretch a fail-closed verdict far past the socket timeout.
With retries off, a call during a failover fails closed at once
(`GovernanceBackendError`), and the next one finds the new master:

- Sentinel: a new connection asks the sentinels for the master's address
  (``MasterNotFoundError``, a ``ConnectionError``, while none is promoted); a
  connection to a master that was demoted gets ``READONLY``, which redis-py
  turns into a ``ConnectionError`` and a reconnect.
- Cluster: a connection error marks the slot table stale and the next command
  reloads it from a live node; ``MOVED`` and ``ASK`` are redirections, followed
  by redis-py (they are not retries). ``SCRIPT LOAD`` goes to every master and
  ``EVALSHA`` to the master of its keys' slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis as sync
import redis.cluster as sync_cluster
import redis.sentinel as sync_sentinel
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio import cluster as async_cluster
from redis.asyncio import sentinel as async_sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.retry import Retry as SyncRetry

from polygate_celery.config.store import StoreConfig, parse_address

MAX_CONNECTIONS = 64  # per store (one per worker process); more operations wait for one
# A cluster client's pools cannot make an operation wait: past this many at once on one
# node it refuses (fail closed), so its bound is wider (redis-py's default is 100).
CLUSTER_MAX_CONNECTIONS = 256

AsyncClient = Redis | async_cluster.RedisCluster
BlockingClient = sync.Redis | sync_cluster.RedisCluster


def _pool_options(socket_timeout_s: float, connect_timeout_s: float) -> dict[str, Any]:
    """Every governance client's connection settings, but the retry (a class per kind).

    Past `MAX_CONNECTIONS` operations at once, an operation waits for a free
    connection (as long as one operation may take) instead of failing: redis-py's
    default pool raises "Too many connections" past 100, which a busy worker
    process (many threads, one event loop) would turn into a fail-closed verdict.
    """
    return {
        "max_connections": MAX_CONNECTIONS,
        "timeout": socket_timeout_s + connect_timeout_s,
        **_connection_options(socket_timeout_s, connect_timeout_s),
    }


def _connection_options(socket_timeout_s: float, connect_timeout_s: float) -> dict[str, Any]:
    options = _cluster_options(socket_timeout_s, connect_timeout_s)
    return {**options, "retry_on_timeout": False, "retry_on_error": []}


def _cluster_options(socket_timeout_s: float, connect_timeout_s: float) -> dict[str, Any]:
    """What a cluster client takes of them (its nodes' connections never retry)."""
    return {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": connect_timeout_s,
        "health_check_interval": 0,
        "decode_responses": True,
    }


def redis_client(
    url: str, *, socket_timeout_s: float = 2.0, connect_timeout_s: float = 2.0
) -> Redis:
    """An asyncio client of the server at `url`, with the governance settings."""
    client: Redis = _url_client(_ASYNC, url, socket_timeout_s, connect_timeout_s)
    return client  # the client owns its pool: closing it closes the pool


def sync_redis_client(
    url: str, *, socket_timeout_s: float = 2.0, connect_timeout_s: float = 2.0
) -> sync.Redis:
    """A blocking client with `redis_client`'s settings, for a caller on its own thread
    (a Celery task's run markers): no hop to an event loop, half the time per script."""
    client: sync.Redis = _url_client(_SYNC, url, socket_timeout_s, connect_timeout_s)
    return client


def _url_client(api: _Api, url: str, socket_timeout_s: float, connect_timeout_s: float) -> Any:
    options = _pool_options(socket_timeout_s, connect_timeout_s)
    pool = api.blocking_pool.from_url(url, retry=api.no_retry(), **options)
    return api.redis.from_pool(pool)


class _SentinelMaster(Redis):
    """The master's client; closing it closes the sentinels' connections too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if manager is not None:
            await manager.aclose()


class _SyncSentinelMaster(sync.Redis):
    """`_SentinelMaster` for the blocking client."""

    def close(self) -> None:
        super().close()
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if manager is not None:
            manager.close()


class _BlockingSentinelPool(async_sentinel.SentinelConnectionPool, BlockingConnectionPool):
    """The master's pool, found through Sentinel, waiting for a free connection when full."""


class _SyncBlockingSentinelPool(sync_sentinel.SentinelConnectionPool, sync.BlockingConnectionPool):
    """`_BlockingSentinelPool` for the blocking client."""


def _secret(value: Any) -> str | None:
    return None if value is None else str(value.get_secret_value())


def _server_credentials(config: StoreConfig) -> dict[str, Any]:
    return {"username": config.username, "password": _secret(config.password)}


def _sentinel_options(config: StoreConfig, retry: Any) -> dict[str, Any]:
    """How the sentinels themselves are asked (their own password, the same timeouts)."""
    return {
        "socket_timeout": config.socket_timeout_s,
        "socket_connect_timeout": config.connect_timeout_s,
        "password": _secret(config.sentinel_password),
        "retry": retry,
        "decode_responses": True,
    }


@dataclass(frozen=True, slots=True)
class _Api:
    """The classes of one of redis-py's two APIs (asyncio or blocking): a client is built
    the same way from either."""

    redis: Any
    blocking_pool: Any
    retry: Any
    sentinel: Any
    sentinel_master: Any
    sentinel_pool: Any
    cluster: Any
    cluster_node: Any

    def no_retry(self) -> Any:
        return self.retry(NoBackoff(), 0)


_ASYNC = _Api(
    redis=Redis,
    blocking_pool=BlockingConnectionPool,
    retry=Retry,
    sentinel=async_sentinel.Sentinel,
    sentinel_master=_SentinelMaster,
    sentinel_pool=_BlockingSentinelPool,
    cluster=async_cluster.RedisCluster,
    cluster_node=async_cluster.ClusterNode,
)
_SYNC = _Api(
    redis=sync.Redis,
    blocking_pool=sync.BlockingConnectionPool,
    retry=SyncRetry,
    sentinel=sync_sentinel.Sentinel,
    sentinel_master=_SyncSentinelMaster,
    sentinel_pool=_SyncBlockingSentinelPool,
    cluster=sync_cluster.RedisCluster,
    cluster_node=sync_cluster.ClusterNode,
)


def governance_client(config: StoreConfig) -> AsyncClient:
    """The asyncio client of the store `config` names (which must be a Redis one)."""
    client: AsyncClient = _governance_client(config, _ASYNC)
    return client


def blocking_governance_client(config: StoreConfig) -> BlockingClient:
    """`governance_client`'s blocking twin (a Celery task's own thread uses it)."""
    client: BlockingClient = _governance_client(config, _SYNC)
    return client


def _governance_client(config: StoreConfig, api: _Api) -> Any:
    timeouts = (config.socket_timeout_s, config.connect_timeout_s)
    if config.sentinels is not None:
        assert config.service_name is not None  # checked at load
        sentinel = api.sentinel(
            [parse_address(a) for a in config.sentinels],
            sentinel_kwargs=_sentinel_options(config, api.no_retry()),
        )
        return sentinel.master_for(
            config.service_name,
            redis_class=api.sentinel_master,
            connection_pool_class=api.sentinel_pool,
            retry=api.no_retry(),
            db=config.db,
            **_server_credentials(config),
            **_pool_options(*timeouts),
        )
    if config.cluster_nodes is not None:
        return api.cluster(
            startup_nodes=[api.cluster_node(*parse_address(a)) for a in config.cluster_nodes],
            retry=api.no_retry(),
            max_connections=CLUSTER_MAX_CONNECTIONS,
            **_server_credentials(config),
            **_cluster_options(*timeouts),
        )
    assert config.redis_url is not None, "no Redis in this store configuration"
    return _url_client(api, config.redis_url.get_secret_value(), *timeouts)


_NODE_KEYS = (
    "username",
    "password",
    "credential_provider",
    "socket_timeout",
    "socket_connect_timeout",
    "decode_responses",
)


def cluster_node_client(client: async_cluster.RedisCluster, attempt: int) -> Redis:
    """A client of one node of the cluster, the `attempt`-th in turn, with the cluster's
    credentials and timeouts (a subscriber: a PUBLISH reaches every node of a cluster,
    so a subscription on any live node hears it; after a failure the next one is tried).
    """
    nodes = client.get_nodes()
    node = nodes[attempt % len(nodes)]
    options = {k: node.connection_kwargs[k] for k in _NODE_KEYS if k in node.connection_kwargs}
    return Redis(host=node.host, port=int(node.port), retry=Retry(NoBackoff(), 0), **options)


def where(config: StoreConfig) -> str:
    """Where the store is, for messages (no credentials)."""
    if config.sentinels is not None:
        return f"Sentinel {','.join(config.sentinels)} (master {config.service_name})"
    if config.cluster_nodes is not None:
        return f"Redis Cluster {','.join(config.cluster_nodes)}"
    return "memory" if config.redis_url is None else "redis_url"


def eviction_policies(config: StoreConfig) -> list[str]:
    """The ``maxmemory-policy`` of every server holding governance keys: the one server,
    Sentinel's master, or each node of a Cluster (replicas too: one may be promoted).

    A short-lived blocking client of its own, closed on return. Raises what the server
    raises when CONFIG is refused (managed services, ACLs).
    """
    client = blocking_governance_client(config)
    try:
        if not isinstance(client, sync_cluster.RedisCluster):
            return _policies([client])
        # every node CLUSTER NODES lists: the client's own table holds the primaries alone
        node = client.get_default_node()  # type: ignore[no-untyped-call]
        kwargs = client.get_redis_connection(node).connection_pool.connection_kwargs
        options = {k: kwargs[k] for k in _NODE_KEYS if k in kwargs}
        servers = []
        for address, info in client.cluster_nodes().items():
            if "fail" in str(info.get("flags", "")) or not info.get("connected", True):
                continue  # a node known failed: promoted replicas are listed beside it
            host, port = parse_address(address.split("@")[0])
            servers.append(
                sync.Redis(host=host, port=port, retry=SyncRetry(NoBackoff(), 0), **options)
            )
        try:
            return _policies(servers)
        finally:
            for server in servers:
                server.close()
    finally:
        client.close()


def _policies(servers: list[sync.Redis]) -> list[str]:
    found = []
    for server in servers:
        value = server.config_get("maxmemory-policy").get("maxmemory-policy")
        if value is not None:
            found.append(value.decode() if isinstance(value, bytes) else str(value))
    return found
