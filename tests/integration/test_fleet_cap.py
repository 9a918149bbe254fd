"""Cap under contention: many processes, one fleet-wide concurrency cap (issue acceptance)."""

from __future__ import annotations

from collections import Counter

from polygate_celery.store.redis import redis_client
from tests.conftest import Figures
from tests.integration.conftest import run_workers
from tests.integration.witness import Witness
from tests.soak import size

PROCESSES, CALLERS = 8, 8
ACQUISITIONS = size(ci=3_000, soak=20_000)


async def test_cap_4_holds_across_8_processes_of_8_callers(
    redis_url: str, fleet_prefix: str, figures: Figures
) -> None:
    """20,000+ acquisitions (soak; 3,000 in CI) with 0-5 ms holds; the witness never
    sees more than 4 at once."""
    witness = await Witness().start()
    calls = -(-ACQUISITIONS // (PROCESSES * CALLERS))
    base = {
        "mode": "witness",
        "redis_url": redis_url,
        "prefix": fleet_prefix,
        "cap": 4,
        "callers": CALLERS,
        "calls": calls,
        "hold_ms": 5,
        "witness_port": witness.port,
        "lease_s": 10,
    }
    try:
        results = await run_workers([{**base, "seed": i} for i in range(PROCESSES)])
    finally:
        await witness.stop()
    outcomes = sum((Counter(r["outcomes"]) for r in results), Counter())
    assert outcomes == {"success": PROCESSES * CALLERS * calls}
    assert witness.served == outcomes["success"]
    assert witness.peak == 4
    figures(f"{outcomes['success']:,} acquisitions, cap 4, witness peak {witness.peak}")


async def test_cap_1_keeps_an_unguarded_counter_exact(redis_url: str, fleet_prefix: str) -> None:
    """Read, pause, write: only the permit stands between the processes' increments."""
    key = f"{fleet_prefix}:counter"
    base = {
        "mode": "counter",
        "redis_url": redis_url,
        "prefix": fleet_prefix,
        "cap": 1,
        "callers": 4,
        "calls": 100,
        "counter_key": key,
        "lease_s": 10,
    }
    results = await run_workers([{**base, "seed": i} for i in range(4)])
    successes = sum(r["outcomes"].get("success", 0) for r in results)
    client = redis_client(redis_url)
    try:
        assert successes == 1_600
        assert int(await client.get(key) or 0) == successes
    finally:
        await client.aclose()
