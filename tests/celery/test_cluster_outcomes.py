"""The Celery outcome rows with the governance store behind a Redis Cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from polygate_celery.config.models import StoreConfig
from tests.celery.outcome_rows import outcome_tasks
from tests.celery.topology_outcomes import run_outcome_rows
from tests.redis_topologies import RedisClusterGroup

app = Celery("polygate_cluster")
tasks = outcome_tasks(app)


@pytest.fixture
def cluster() -> Iterator[RedisClusterGroup]:
    with RedisClusterGroup() as cluster:
        yield cluster


@pytest.mark.timeout(300)
def test_one_celery_outcome_per_row_on_a_cluster(cluster: RedisClusterGroup, broker: str) -> None:
    store = StoreConfig(cluster_nodes=cluster.nodes)
    run_outcome_rows(app, tasks, broker, store)
