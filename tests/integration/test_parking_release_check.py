"""The parking lot's release check on a real Redis: an entry released again while its run
has not begun waits twice as long each time, so a task queued behind a long backlog is
copied a few times, not once per `release_check_s` for as long as the backlog lasts."""

from __future__ import annotations

import uuid

import pytest

from polygate_celery.celery.parking import ParkingLot
from tests.integration.conftest import PARKED_MESSAGE

KEEP_S = 100.0


async def due_in(lot: ParkingLot, entry: str) -> float:
    """Seconds until `entry` is due again, on Redis's clock."""
    seconds, micros = await lot.client.time()
    score = await lot.client.zscore(lot.keys[0], entry)
    assert score is not None
    return float(score) - (seconds + micros / 1e6)


async def release(lot: ParkingLot, entry: str) -> float:
    """Make `entry` due, claim and confirm it as a releaser does; its next check, in s."""
    await lot.client.zadd(lot.keys[0], {entry: 0})
    token = uuid.uuid4().hex
    ((claimed, _),) = await lot.claim(10, 30.0, token)
    assert claimed == entry
    assert await lot.confirm(entry, token, KEEP_S)
    return await due_in(lot, entry)


async def test_each_release_of_an_entry_whose_run_has_not_begun_waits_twice_as_long(
    lot: ParkingLot,
) -> None:
    await lot.park("run-1", 0.0, dict(PARKED_MESSAGE), 60.0)
    waits = [await release(lot, "run-1") for _ in range(8)]
    expected = [KEEP_S * 2**n for n in (0, 1, 2, 3, 4, 5, 5, 5)]  # doubled 5 times at most
    for wait, want in zip(waits, expected, strict=True):
        assert want - 5 < wait <= want


@pytest.mark.parametrize("how", ["forgotten", "buried"])
async def test_an_entry_that_leaves_the_lot_leaves_no_release_count(
    lot: ParkingLot, how: str
) -> None:
    await lot.park("run-1", 0.0, dict(PARKED_MESSAGE), 60.0)
    await release(lot, "run-1")
    await release(lot, "run-1")
    await lot.client.zadd(lot.keys[0], {"run-1": 0})
    token = uuid.uuid4().hex
    await lot.claim(10, 30.0, token)
    if how == "forgotten":
        assert await lot.confirm("run-1", token, 0.0)  # confirmed without keeping
    else:
        await lot.bury("run-1", token, "test")
    assert await lot.client.hgetall(lot.keys[1]) == {}
    await lot.park("run-1", 0.0, dict(PARKED_MESSAGE), 60.0)  # parked anew: counted from one
    assert KEEP_S - 5 < await release(lot, "run-1") <= KEEP_S
