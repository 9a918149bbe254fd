"""The Celery state's fixtures: one `state` per implementation (the contract suite runs on
both), on a `VirtualClock` that only the in-memory twin follows (Redis keeps its own
``TIME``: a case that moves time runs on the twin alone)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from polygate_celery.celery.state import CeleryState, MarkerTerms, MemoryCeleryState, RunStart
from polygate_celery.celery.state.redis import RedisCeleryState
from polygate_celery.store.redis import KeySpace, redis_client, sync_redis_client
from polygate_celery.testing import VirtualClock
from tests.conftest import unique_prefix
from tests.integration.conftest import PARKED_MESSAGE

TERMS = MarkerTerms(run_ttl_s=10.0, done_ttl_s=600.0, cap=2)


def start(run: str, token: str, copy: bool, began_at: float, lot: str | None = None) -> RunStart:
    """A run about to begin, on `TERMS`."""
    return RunStart(run, token, copy, TERMS, began_at, lot)


def message(entry: str) -> dict[str, Any]:
    return {**PARKED_MESSAGE, "headers": {"id": entry, "task": "t"}}


@pytest_asyncio.fixture(params=["memory", "redis"])
async def state(request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[CeleryState]:
    """A Celery state of one kind; a Redis one under its own prefix, its keys removed after."""
    if request.param == "memory":
        yield MemoryCeleryState(clock)
        return
    url = request.getfixturevalue("redis_url")
    keys = KeySpace(prefix=unique_prefix())
    client, blocking = redis_client(url), sync_redis_client(url)
    yield RedisCeleryState(client, keys, lambda: blocking)
    found = [key async for key in client.scan_iter(match=keys.pattern)]
    if found:
        await client.delete(*found)
    await client.aclose()
    blocking.close()


@pytest.fixture
def memory(clock: VirtualClock) -> MemoryCeleryState:
    """The in-memory twin alone, for cases that move time."""
    return MemoryCeleryState(clock)
