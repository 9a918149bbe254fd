"""One wake-up per released permit, fleet-wide: a release hands its permit to the first
waiting call of the whole fleet (first come, first served across processes), and only
that call's process is told. Real worker processes on a real Redis, default settings."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from typing import Any

import pytest

from polygate_celery.governance.plan import claim_for
from polygate_celery.store.redis import KeySpace, redis_client
from tests.conftest import Figures
from tests.integration.conftest import result_of, run_workers, spawn_worker
from tests.integration.witness import Witness
from tests.soak import size

CALLERS = 32  # in all, shared out over the processes
POLL_S = 1.0  # the package's default poll_interval_s
CLAIM_S = claim_for(POLL_S)


@pytest.mark.parametrize("processes", [1, 8, *([32] if size(ci=0, soak=1) else [])])
async def test_a_release_wakes_one_waiter_of_the_fleet(
    processes: int, redis_url: str, fleet_prefix: str, figures: Figures
) -> None:
    """Refused admissions per acquisition stay about one (a caller's first ask) whatever
    the number of processes; the cap holds."""
    per_acquisition, peak = await _contend(
        processes, redis_url, fleet_prefix, hold_ms=5, calls=size(ci=8, soak=40)
    )
    figures(
        f"wake-ups, {processes} x {CALLERS // processes} callers, cap 4: "
        f"{per_acquisition:.2f} refused admissions per acquisition, witness peak {peak}"
    )


async def test_waiting_longer_than_a_poll_costs_no_more_refusals(
    redis_url: str, fleet_prefix: str, figures: Figures
) -> None:
    """Holds of up to 1 s: a caller waits for a permit seconds, several poll intervals;
    its place in the queue is kept for it (`governance.places`), so it is refused once,
    not at each poll."""
    processes, hold_ms = 4, 1000
    per_acquisition, peak = await _contend(
        processes, redis_url, fleet_prefix, hold_ms=hold_ms, calls=size(ci=2, soak=6)
    )
    figures(
        f"long waits, {processes} x {CALLERS // processes} callers, cap 4, "
        f"holds up to {hold_ms} ms: "
        f"{per_acquisition:.2f} refused admissions per acquisition, witness peak {peak}"
    )


async def _contend(
    processes: int, redis_url: str, prefix: str, *, hold_ms: int, calls: int
) -> tuple[float, int]:
    """`CALLERS` callers over `processes` processes contend for a cap of 4, each making
    `calls` calls that hold their permit `hold_ms`: every call succeeds, the witness
    never sees more than 4 at once, and refused admissions per acquisition stay at most
    1.5. Returns those refusals per acquisition and the witness's peak."""
    witness = await Witness().start()
    base = {
        "mode": "witness",
        "redis_url": redis_url,
        "prefix": prefix,
        "cap": 4,
        "callers": CALLERS // processes,
        "calls": calls,
        "hold_ms": hold_ms,
        "witness_port": witness.port,
        "lease_s": 30,
        "poll_interval_s": POLL_S,
    }
    try:
        results = await run_workers([{**base, "seed": i} for i in range(processes)])
    finally:
        await witness.stop()
    outcomes = sum((Counter(r["outcomes"]) for r in results), Counter())
    granted = sum(r["granted"] for r in results)
    refused = sum(r["admits"] - r["granted"] for r in results)
    assert outcomes == {"success": CALLERS * calls}
    assert granted == witness.served == CALLERS * calls
    assert witness.peak <= 4  # (that 4 are reached is test_fleet_cap's, at 3,000 acquisitions)
    per_acquisition = refused / granted
    assert per_acquisition <= 1.5
    return per_acquisition, witness.peak


async def _holder(redis_url: str, prefix: str, order_key: str, hold_key: str) -> Any:
    """A process holding the only permit until the test pushes to `hold_key`."""
    process = await spawn_worker(
        {
            "mode": "ordered",
            "name": "holder",
            "redis_url": redis_url,
            "prefix": prefix,
            "cap": 1,
            "lease_s": 30,
            "poll_interval_s": POLL_S,
            "order_key": order_key,
            "hold_key": hold_key,
        }
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    assert b"holding" in line
    return process


async def _queued(client: Any, queue: str, n: int, deadline_s: float = 60) -> None:
    """Wait until the source's fleet-wide queue holds `n` waiters."""
    end = time.monotonic() + deadline_s
    while await client.zcard(queue) < n:
        assert time.monotonic() < end, f"fewer than {n} waiters queued"
        await asyncio.sleep(0.02)


def _waiter_spec(redis_url: str, prefix: str, order_key: str, name: str) -> dict[str, Any]:
    return {
        "mode": "ordered",
        "name": name,
        "redis_url": redis_url,
        "prefix": prefix,
        "cap": 1,
        "lease_s": 30,
        "poll_interval_s": POLL_S,
        "order_key": order_key,
    }


async def test_waiters_of_different_processes_are_served_in_arrival_order(
    redis_url: str, fleet_prefix: str
) -> None:
    order_key, hold_key = f"{fleet_prefix}:order", f"{fleet_prefix}:hold"
    queue = KeySpace(fleet_prefix).queue("w")
    client = redis_client(redis_url, socket_timeout_s=30)
    holder = await _holder(redis_url, fleet_prefix, order_key, hold_key)
    names = [f"w{i}" for i in range(5)]
    waiters = []
    try:
        for i, name in enumerate(names):  # each joins the queue before the next starts
            waiters.append(
                await spawn_worker(_waiter_spec(redis_url, fleet_prefix, order_key, name))
            )
            await _queued(client, queue, i + 1)
        await client.rpush(hold_key, "go")
        results = [await result_of(p, 120) for p in [holder, *waiters]]
        assert all(r["outcomes"] == {"success": 1} for r in results)
        assert await client.lrange(order_key, 0, -1) == ["holder", *names]
    finally:
        await client.aclose()


async def test_a_release_wakes_the_waiter_of_another_process_at_once(
    redis_url: str, fleet_prefix: str, figures: Figures
) -> None:
    """The waiter polls a minute apart (its place kept every 40 s): it is served as soon
    as the release hands it the permit, because the message to its process wakes it."""
    order_key, hold_key = f"{fleet_prefix}:order", f"{fleet_prefix}:hold"
    keys = KeySpace(fleet_prefix)
    client = redis_client(redis_url, socket_timeout_s=30)
    holder = await _holder(redis_url, fleet_prefix, order_key, hold_key)
    try:
        spec = {**_waiter_spec(redis_url, fleet_prefix, order_key, "next"), "poll_interval_s": 60}
        waiter = await spawn_worker(spec)
        await _queued(client, keys.queue("w"), 1)
        end = time.monotonic() + 60
        while not await client.pubsub_channels(keys.wake + "*"):  # its process listens
            assert time.monotonic() < end, "the waiter's process never subscribed"
            await asyncio.sleep(0.02)
        released = time.monotonic()
        await client.rpush(hold_key, "go")
        while await client.llen(order_key) < 2:
            assert time.monotonic() - released < 20, "the waiter was not woken by the release"
            await asyncio.sleep(0.02)
        waited = time.monotonic() - released
        assert [r["outcomes"] for r in [await result_of(holder), await result_of(waiter)]] == [
            {"success": 1},
            {"success": 1},
        ]
        figures(f"a waiter of another process: granted {waited:.2f} s after the release")
    finally:
        await client.aclose()


async def _after_a_killed_waiter(
    redis_url: str, prefix: str, dead: dict[str, Any], following: dict[str, Any]
) -> float:
    """A holder of the only permit; a waiter (`dead` added to its spec) queued, then
    SIGKILLed; another (`following`) queued behind it; the permit released: seconds
    until the other got it. Both live processes succeeded, in that order."""
    order_key, hold_key = f"{prefix}:order", f"{prefix}:hold"
    queue = KeySpace(prefix).queue("w")
    client = redis_client(redis_url, socket_timeout_s=30)
    holder = await _holder(redis_url, prefix, order_key, hold_key)
    try:
        spec = _waiter_spec(redis_url, prefix, order_key, "dead")
        killed = await spawn_worker({**spec, **dead})
        await _queued(client, queue, 1)
        os.kill(killed.pid, signal.SIGKILL)
        await killed.wait()
        spec = _waiter_spec(redis_url, prefix, order_key, "next")
        behind = await spawn_worker({**spec, **following})
        await _queued(client, queue, 2)
        released = time.monotonic()
        await client.rpush(hold_key, "go")
        while await client.llen(order_key) < 2:
            assert time.monotonic() - released < 30, "the next waiter never got the permit"
            await asyncio.sleep(0.02)
        waited = time.monotonic() - released
        assert [r["outcomes"] for r in [await result_of(holder), await result_of(behind)]] == [
            {"success": 1},
            {"success": 1},
        ]
        assert await client.lrange(order_key, 0, -1) == ["holder", "next"]
        return waited
    finally:
        await client.aclose()


async def test_a_killed_waiter_delays_the_next_grant_by_its_claim_at_most(
    redis_url: str, fleet_prefix: str, figures: Figures
) -> None:
    """The permit handed to a SIGKILLed waiter comes back when the claim ends (3 s by
    default), not with the 30 s lease, nor never."""
    waited = await _after_a_killed_waiter(redis_url, fleet_prefix, {}, {})
    # its claim (3 s) and one poll of the next waiter (1 s), with room for a busy machine
    assert waited < CLAIM_S + POLL_S + 10
    figures(f"a SIGKILLed waiter: the next waiter's grant {waited:.1f} s after the release")


async def test_a_killed_waiter_of_a_higher_class_holds_up_a_lower_one_by_its_claim_at_most(
    redis_url: str, fleet_prefix: str
) -> None:
    """Classes declared: an interactive waiter, first in the queue, is SIGKILLed; the
    batch waiter behind it gets the released permit when the dead one's claim ends."""
    classes = {"priorities": {"interactive": {}, "batch": {"default": True}}}
    interactive = {**classes, "priority": "interactive"}
    waited = await _after_a_killed_waiter(
        redis_url, fleet_prefix, interactive, {**classes, "priority": "batch"}
    )
    assert waited < CLAIM_S + POLL_S + 10


async def test_callers_waiting_for_a_quota_are_served_in_the_order_they_booked(
    redis_url: str, fleet_prefix: str
) -> None:
    """Callers of different processes refused by an rpm bucket book their slots: each is
    served at its own, in the order they asked, after one refusal each (no asking again
    at every refill)."""
    order_key = f"{fleet_prefix}:order"
    alive = KeySpace(fleet_prefix).alive("w")
    client = redis_client(redis_url, socket_timeout_s=30)
    quota = {
        "redis_url": redis_url,
        "prefix": fleet_prefix,
        "cap": 4,
        "lease_s": 30,
        "rpm": 20,  # a bucket: 20 at once (the 20th after the arrival margin), one per 3 s
        "poll_interval_s": POLL_S,
    }
    try:
        spender = await spawn_worker({**quota, "mode": "status", "calls": 20})  # the burst
        assert (await result_of(spender, 120))["outcomes"] == {"success": 20}
        names = [f"w{i}" for i in range(4)]
        waiters = []
        for i, name in enumerate(names):  # each books before the next starts
            spec = {**quota, "mode": "ordered", "name": name, "order_key": order_key}
            waiters.append(await spawn_worker(spec))
            await _booked(client, alive, order_key, i + 1)
        results = [await result_of(p, 120) for p in waiters]
        assert all(r["outcomes"] == {"success": 1} for r in results)
        assert await client.lrange(order_key, 0, -1) == names
        # one refusal each at most: the ask that booked (none for one whose slot had come)
        assert all(r["admits"] - r["granted"] <= 1 for r in results), results
    finally:
        await client.aclose()


async def _booked(client: Any, alive: str, order_key: str, n: int, deadline_s: float = 60) -> None:
    """Wait until `n` callers hold a booking of the source's quota or were served."""
    end = time.monotonic() + deadline_s
    while True:
        members = await client.zrange(alive, 0, -1)
        booked = sum(m.startswith("@") for m in members)
        if booked + await client.llen(order_key) >= n:
            return
        assert time.monotonic() < end, f"fewer than {n} bookings"
        await asyncio.sleep(0.02)
