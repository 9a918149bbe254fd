"""Fleet tests: worker processes, a real Redis, and real time (they are not unit tests)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest_asyncio

from polygate_celery.celery.parking import ParkingLot
from polygate_celery.store.redis import redis_client
from polygate_celery.store.redis.keys import KeySpace
from tests.conftest import unique_prefix

ROOT = Path(__file__).resolve().parents[2]
Spawn = Callable[[dict[str, Any]], Awaitable[asyncio.subprocess.Process]]


_SPAWNED: list[asyncio.subprocess.Process] = []


async def spawn_worker(spec: dict[str, Any]) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.fleet_worker",
        json.dumps(spec),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    _SPAWNED.append(process)
    return process


@pytest_asyncio.fixture(autouse=True)
async def _no_worker_outlives_its_test() -> AsyncIterator[None]:
    """A test that failed before reading its workers' results leaves none running, and
    no pipe for a later test's garbage collection to report."""
    yield
    while _SPAWNED:
        process = _SPAWNED.pop()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.communicate()


async def result_of(process: asyncio.subprocess.Process, limit_s: float = 300) -> dict[str, Any]:
    stdout, _ = await asyncio.wait_for(process.communicate(), limit_s)
    assert process.returncode == 0, f"worker exited with {process.returncode}"
    last = stdout.decode().strip().splitlines()[-1]
    result: dict[str, Any] = json.loads(last)
    return result


async def run_workers(specs: list[dict[str, Any]], limit_s: float = 300) -> list[dict[str, Any]]:
    processes = [await spawn_worker(spec) for spec in specs]
    return list(await asyncio.gather(*(result_of(p, limit_s) for p in processes)))


@pytest_asyncio.fixture
async def fleet_prefix(redis_url: str) -> AsyncIterator[str]:
    """A key prefix of the test's own; its keys are removed afterwards."""
    prefix = unique_prefix()
    yield prefix
    client = redis_client(redis_url)
    # Governance keys of this prefix (and of prefixes derived from it), and the test's own.
    keys = [k async for k in client.scan_iter(match=f"{{{prefix}*")]
    keys += [k async for k in client.scan_iter(match=f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


# A task message as a parking lot holds it (what `capture_message` gives).
PARKED_MESSAGE: dict[str, Any] = {
    "body": [[], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
    "headers": {"id": "t", "task": "t"},
    "exchange": "",
    "routing_key": "q",
    "serializer": "json",
    "compression": None,
    "delivery_mode": 2,
    "properties": {},
}


@pytest_asyncio.fixture
async def lot(redis_url: str, fleet_prefix: str) -> AsyncIterator[ParkingLot]:
    """A parking lot under the test's own prefix (`fleet_prefix` removes its keys)."""
    client = redis_client(redis_url)
    yield ParkingLot(client, KeySpace(prefix=fleet_prefix), "lot")
    await client.aclose()
