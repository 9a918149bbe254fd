"""The Celery outcome rows with the governance store behind Redis Sentinel."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from polygate_celery.config.models import StoreConfig
from tests.celery.outcome_rows import outcome_tasks
from tests.celery.topology_outcomes import run_outcome_rows
from tests.redis_topologies import SentinelGroup

app = Celery("polygate_sentinel")
tasks = outcome_tasks(app)


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as group:
        yield group


@pytest.mark.timeout(300)
def test_one_celery_outcome_per_row_on_sentinel(group: SentinelGroup, broker: str) -> None:
    store = StoreConfig(sentinels=group.sentinels, service_name=group.service)
    run_outcome_rows(app, tasks, broker, store)
