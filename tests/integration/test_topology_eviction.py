"""The eviction check at worker start asks every server that holds governance keys.

A Sentinel master or any Cluster node (a replica too: it may be promoted) set to a
policy that may evict keys gets the same warning as one server named by `redis_url`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from polygate_celery import parse_config
from polygate_celery.celery import configure_worker
from polygate_celery.celery.runtime import reset_runtime
from polygate_celery.celery.worker import check_eviction_policy
from tests.redis_topologies import RedisClusterGroup, SentinelGroup

CONFIG = {
    "sources": {"s": {"base_url": "http://127.0.0.1:1", "model": "m"}},
    "scopes": {"x": {"kind": "embedding", "sources": ["s"]}},
}


def checked(store: dict[str, object], caplog: pytest.LogCaptureFixture) -> str | None:
    app = Celery("eviction")
    configure_worker(app, parse_config({**CONFIG, "store": store}))
    try:
        with caplog.at_level(logging.WARNING, logger="polygate_celery"):
            return check_eviction_policy(app)
    finally:
        reset_runtime(app)


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterGroup]:
    with RedisClusterGroup() as cluster:
        yield cluster


def assert_reported(
    store: dict[str, object], port: int, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """noeviction everywhere passes quietly; `policy` set on the server at `port` alone is
    found and warned of."""
    assert checked(store, caplog) == "noeviction"
    assert "maxmemory-policy" not in caplog.text
    with redis.Redis(port=port) as server:
        server.config_set("maxmemory-policy", policy)
        try:
            assert checked(store, caplog) == policy
        finally:
            server.config_set("maxmemory-policy", "noeviction")
    assert f"Redis maxmemory-policy is '{policy}'" in caplog.text


def test_sentinels_master_is_asked(
    sentinel: SentinelGroup, caplog: pytest.LogCaptureFixture
) -> None:
    store: dict[str, object] = {"sentinels": sentinel.sentinels, "service_name": sentinel.service}
    assert_reported(store, sentinel.master(), "volatile-lru", caplog)


def test_every_cluster_node_is_asked(
    cluster: RedisClusterGroup, caplog: pytest.LogCaptureFixture
) -> None:
    # the last node: one the configuration does not name
    assert_reported({"cluster_nodes": cluster.nodes[:1]}, cluster.ports[-1], "allkeys-lru", caplog)
