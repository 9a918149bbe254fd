"""A SIGKILLed worker's permit comes back on its own once its lease runs out."""

from __future__ import annotations

import asyncio
import json
import signal
import time

from polygate_celery.core.breaker import Effect
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store import AdmitRequest, Grant, Settlement
from polygate_celery.store.redis import RedisStore
from tests.conftest import Figures
from tests.integration.conftest import spawn_worker

TRIALS, LEASE_S = 20, 3.0


async def freed_after(store: RedisStore, source: SourceTerms, killed_at: float) -> float:
    """Seconds from the kill until a permit at `source` can be had; checks the count too."""
    n = 0
    while True:
        snapshot = await store.snapshot(source)
        assert 0 <= snapshot.permits_in_use <= source.max_concurrency
        n += 1
        admission = await store.admit(AdmitRequest("s", (source,), f"probe-{n}"))
        if isinstance(admission, Grant):
            freed = time.monotonic() - killed_at
            await store.settle(
                Settlement("s", source, admission.permit_id, admission.admitted_at, Effect.NEUTRAL)
            )
            return freed
        assert time.monotonic() - killed_at < 10 * LEASE_S, "the permit never came back"
        await asyncio.sleep(0.02)


async def lease_ends(store: RedisStore, sources: list[str]) -> tuple[float, list[float]]:
    """Redis ``TIME`` now, and the latest lease expiry held at each source."""
    async with store.client.pipeline(transaction=False) as pipe:
        pipe.time()
        for name in sources:
            pipe.zrange(store.keys.permits(name), -1, -1, withscores=True)
        now, *held = await pipe.execute()
    return now[0] + now[1] / 1e6, [members[0][1] for members in held]


async def test_a_killed_holders_permit_is_free_within_its_lease(
    redis_url: str, fleet_prefix: str, figures: Figures
) -> None:
    """20 trials at once: each process holds the only permit of its own source.

    The rule is checked on Redis's clock (no lease held at the kill outlives it by more
    than `lease_s`); how long the probes then took to see it free depends on the machine,
    and is reported, not judged."""
    holders = []
    for i in range(TRIALS):
        spec = {
            "mode": "hold",
            "redis_url": redis_url,
            "prefix": fleet_prefix,
            "cap": 1,
            "sources": [f"src-{i}"],
            "lease_s": LEASE_S,
        }
        holders.append(await spawn_worker(spec))
    for process in holders:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert json.loads(line) == {"holding": True}

    store = RedisStore.from_url(redis_url, prefix=fleet_prefix, lease_s=LEASE_S)
    try:
        for i in range(TRIALS):  # held: nobody else gets in
            admission = await store.admit(AdmitRequest("s", (SourceTerms(f"src-{i}", 1),), "x"))
            assert not isinstance(admission, Grant)
        killed_at = time.monotonic()
        for process in holders:
            process.send_signal(signal.SIGKILL)
        killed_on_redis, expiries = await lease_ends(store, [f"src-{i}" for i in range(TRIALS)])
        assert max(expiries) <= killed_on_redis + LEASE_S, (killed_on_redis, sorted(expiries))
        freed = await asyncio.gather(
            *(freed_after(store, SourceTerms(f"src-{i}", 1), killed_at) for i in range(TRIALS))
        )
    finally:
        await store.aclose()
        for process in holders:
            await process.wait()
    figures(f"reclaimed after SIGKILL (s): min {min(freed):.2f} max {max(freed):.2f}")
