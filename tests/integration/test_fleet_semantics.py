"""One governed client across processes: pauses and progress seen by every worker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from polygate_celery.store.redis import RedisStore, redis_client
from tests.integration.conftest import result_of, run_workers, spawn_worker


def spec(redis_url: str, prefix: str, **fields: Any) -> dict[str, Any]:
    return {
        "mode": "status",
        "redis_url": redis_url,
        "prefix": prefix,
        "cap": 4,
        "lease_s": 10,
        **fields,
    }


async def test_a_retry_after_seen_by_one_process_pauses_the_source_for_another(
    redis_url: str, fleet_prefix: str
) -> None:
    started = time.monotonic()  # the pause begins after this
    (first,) = await run_workers(
        [spec(redis_url, fleet_prefix, step="429:30", kind="embedding", max_attempts=1)]
    )
    assert first["outcomes"] == {"retry_exhausted": 1, "retry_after_s": 30}

    (second,) = await run_workers([spec(redis_url, fleet_prefix, step="ok", fail_fast=True)])
    # The second process is told what is left of the pause: 30 s less the time since it
    # began, whatever the processes' start-up took (seconds on a busy machine); one more
    # for rounding.
    since = time.monotonic() - started
    assert second["outcomes"]["fail_fast"] == 1
    assert 30 - since - 1 <= second["outcomes"]["retry_after_s"] <= 30
    assert second["sent"] == 0  # the source saw nothing from the second process


async def paused_call(redis_url: str, prefix: str, *, keeper: bool) -> dict[str, Any]:
    """Process B waits 6 s for its paused source, with a 2 s stall window; process A
    (if `keeper`) succeeds in the same scope every 0.5 s through another source. The pause
    is set once both processes are ready: their start-up (seconds on a busy machine) must
    not eat into it."""
    signals = {"ready_key": f"{prefix}:ready", "go_key": f"{prefix}:go"}
    waiter = await spawn_worker(
        spec(redis_url, prefix, sources=["x"], kind="chat", stall_window_s=2,
             poll_interval_s=0.2, **signals)
    )  # fmt: skip
    other = None
    if keeper:
        other = await spawn_worker(
            spec(redis_url, prefix, sources=["y"], calls=20, pace_s=0.5, poll_interval_s=0.2,
                 **signals)
        )  # fmt: skip
    client = redis_client(redis_url, socket_timeout_s=130)  # above the BLPOP's 120 s
    for _ in range(2 if keeper else 1):
        assert await client.blpop([signals["ready_key"]], timeout=120) is not None
    store = RedisStore.from_url(redis_url, prefix=prefix)
    await store.pause_source("x", 6.0)
    await store.aclose()
    paused_at = time.monotonic()
    await client.rpush(signals["go_key"], *["go"] * (2 if keeper else 1))
    await client.aclose()
    result = await result_of(waiter)
    result["since_pause_s"] = time.monotonic() - paused_at
    if other is not None:
        assert (await result_of(other))["outcomes"] == {"success": 20}
    return result


async def test_progress_in_one_process_keeps_another_out_of_the_stall_verdict(
    redis_url: str, fleet_prefix: str
) -> None:
    kept, alone = await asyncio.gather(
        paused_call(redis_url, fleet_prefix, keeper=True),
        paused_call(redis_url, f"{fleet_prefix}-alone", keeper=False),
    )
    assert kept["outcomes"] == {"success": 1}  # waited out the pause: the scope was alive
    assert kept["since_pause_s"] >= 6.0
    assert kept["seconds"] > 2 * 2  # well past its own 2 s stall window
    assert alone["outcomes"]["stalled"] == 1  # nothing anywhere made progress
    assert alone["seconds"] < 6.0  # it gave up while the source was still paused
