"""The store contract suite on a Redis Cluster (three masters, three replicas, started
from redis-server): every test id ends in ``[cluster]``. The tests name sources no
configuration groups, so each store's keys share its prefix's tag (one slot)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from polygate_celery.config.models import StoreConfig
from tests.integration.topology_contract import contract_fixtures
from tests.redis_topologies import RedisClusterGroup
from tests.unit.store.test_store_contract_bookings import *  # noqa: F403
from tests.unit.store.test_store_contract_gate import *  # noqa: F403
from tests.unit.store.test_store_contract_learned import *  # noqa: F403
from tests.unit.store.test_store_contract_operator import *  # noqa: F403
from tests.unit.store.test_store_contract_permits import *  # noqa: F403
from tests.unit.store.test_store_contract_places import *  # noqa: F403
from tests.unit.store.test_store_contract_state import *  # noqa: F403


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterGroup]:
    with RedisClusterGroup() as cluster:
        yield cluster


@pytest.fixture
def topology_config(cluster: RedisClusterGroup) -> StoreConfig:
    return StoreConfig(cluster_nodes=cluster.nodes[:2])


store_factory, store, h = contract_fixtures("cluster")
