"""The store contract suite on a Redis Sentinel deployment (a master, a replica, three
sentinels, started from redis-server): every test id ends in ``[sentinel]``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from polygate_celery.config.models import StoreConfig
from tests.integration.topology_contract import contract_fixtures
from tests.redis_topologies import SentinelGroup
from tests.unit.store.test_store_contract_bookings import *  # noqa: F403
from tests.unit.store.test_store_contract_gate import *  # noqa: F403
from tests.unit.store.test_store_contract_learned import *  # noqa: F403
from tests.unit.store.test_store_contract_operator import *  # noqa: F403
from tests.unit.store.test_store_contract_permits import *  # noqa: F403
from tests.unit.store.test_store_contract_places import *  # noqa: F403
from tests.unit.store.test_store_contract_state import *  # noqa: F403


@pytest.fixture(scope="module")
def sentinel_group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


@pytest.fixture
def topology_config(sentinel_group: SentinelGroup) -> StoreConfig:
    return StoreConfig(sentinels=sentinel_group.sentinels, service_name=sentinel_group.service)


store_factory, store, h = contract_fixtures("sentinel")
