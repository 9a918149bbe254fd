"""Parked tasks of a scope's outage come back when it answers again (SPEC §3 rule 16),
on a real Redis: park.lua indexes an outage's entries by scope, and wake.lua makes them
due at once (all of them on recovery; the earliest as a probe, once per interval)."""

from __future__ import annotations

import asyncio

from polygate_celery import parse_config
from polygate_celery.celery.parking import ParkingLot, probe_intervals
from tests.conftest import make_config
from tests.integration.conftest import PARKED_MESSAGE


async def park(lot: ParkingLot, entry: str, due_in_s: float, scope: str | None = "s") -> None:
    message = {**PARKED_MESSAGE, "headers": {"id": entry, "task": "t"}}
    await lot.park(entry, due_in_s, message, 60.0, scope=scope)


async def due_now(lot: ParkingLot) -> set[str]:
    ids = await lot.client.zrangebyscore(lot.keys[0], "-inf", "+inf")
    now = await lot.client.time()
    at = now[0] + now[1] / 1e6
    return {str(i) for i in ids if float(await lot.client.zscore(lot.keys[0], i)) <= at}


async def test_the_scope_answering_makes_its_outage_entries_due_now(lot: ParkingLot) -> None:
    await park(lot, "run-1", 324.4)
    await park(lot, "run-2", 600.0)
    await park(lot, "other-1", 300.0, scope="other")
    await park(lot, "reset-1", 300.0, scope=None)  # waits for a rate limit: not indexed
    assert await due_now(lot) == set()
    assert await lot.wake("s") == 2
    assert await due_now(lot) == {"run-1", "run-2"}
    assert len(await lot.claim(10, 30.0, "releaser")) == 2
    assert await lot.wake("s") == 0  # the index was emptied
    assert await lot.client.zcard(lot.scope_index("s")) == 0


async def test_an_entry_claimed_or_released_is_not_woken_again(lot: ParkingLot) -> None:
    await park(lot, "run-1", 0.0)
    await park(lot, "run-2", 0.0)
    claimed = await lot.claim(10, 30.0, "releaser")
    assert len(claimed) == 2
    await lot.confirm_all(["run-1"], "releaser", 300.0)  # published, kept until its run
    assert await lot.wake("s") == 0  # one released, one claimed: the release loop has them
    assert await lot.client.zcard(lot.scope_index("s")) == 0


async def test_a_probe_comes_back_once_per_interval_while_all_are_parked(
    lot: ParkingLot,
) -> None:
    await park(lot, "run-late", 600.0)
    await park(lot, "run-early", 100.0)
    assert await lot.wake("s", probe_interval_s=0.5) == 1
    assert await due_now(lot) == {"run-early"}  # the earliest
    assert await lot.wake("s", probe_interval_s=0.5) == 0  # one per interval
    await asyncio.sleep(0.8)  # the interval's marker is a Redis TTL
    assert await lot.wake("s", probe_interval_s=0.5) == 1
    assert await due_now(lot) == {"run-early", "run-late"}


async def test_no_probe_when_one_comes_back_soon_anyway(lot: ParkingLot) -> None:
    await park(lot, "run-1", 5.0)
    assert await lot.wake("s", probe_interval_s=10.0) == 0
    assert await due_now(lot) == set()


def test_the_probe_interval_is_the_shortest_cooldown_at_most_15_s() -> None:
    assert probe_intervals(make_config("chat")) == {"s": 10.0}
    slow = make_config("chat", {"a": {"breaker": {"cooldown_s": 60}}})
    assert probe_intervals(slow) == {"s": 15.0}


def test_a_class_starved_in_a_scope_is_probed_once_per_governed_stall_window() -> None:
    classes = parse_config(
        {
            "sources": {"a": {}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}, "t": {"kind": "chat",
                       "sources": ["a"], "stall_window_s": 5}},
            "priorities": {"interactive": {}, "normal": {}, "batch": {}},
        }
    )  # fmt: skip
    assert probe_intervals(classes) == {
        "s": 10.0,
        "t": 10.0,
        **{f"s@{c}": 60.0 for c in ("interactive", "normal", "batch")},  # a governed task's
        **{f"t@{c}": 5.0 for c in ("interactive", "normal", "batch")},  # as set
    }
