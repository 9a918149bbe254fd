"""Governance overhead of the Redis store: round trips, latency against PING, memory.

Run: ``.venv/bin/python benchmarks/redis_store.py [--redis URL] [--calls N]``
(default: 127.0.0.1:6379, or a private redis-server when nothing answers there).
Prints a Markdown report; `benchmarks/results/redis_store.md` is the committed run.

What it measures, all against an instant source (no provider latency):

* Redis commands per successful, uncontended governed call, from the server's
  ``INFO commandstats`` (target: 2 script calls, admit and settle);
* per-call latency of a bare call (the source alone), a governed call on the
  in-memory store and on the Redis store, and one async ``PING`` on the same
  client, in the same run; overhead = governed - bare, and its ratio to PING
  (target: at most 3);
* ``MEMORY USAGE`` of the keys one source, one quota group and one scope cost,
  and of a full sliding-window log at 120 and 10,000 requests a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polygate_celery import Gateway, MemoryStore, Outcome, parse_config
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store import AdmitRequest
from polygate_celery.store.redis import RedisStore
from tests.redis_server import RedisServer, reachable_redis

CONFIG = {
    "sources": {"fast": {"max_concurrency": 8, "rpm": 1_000_000, "tpm": 100_000_000}},
    "scopes": {"bench": {"kind": "chat", "sources": ["fast"]}},
}


class InstantSource:
    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        return Outcome.success(payload, prompt_tokens=10, completion_tokens=5)


async def timed(n: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    for _ in range(min(200, n)):  # warm up: connections, script cache
        await call()
    gc.collect()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


def p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


CLIENT_COMMANDS = {"evalsha", "eval", "script|load", "ping", "subscribe"}


async def commands_per_call(
    store: RedisStore, gateway: Gateway, n: int
) -> tuple[dict[str, float], dict[str, float], float]:
    """(round trips per call, commands the scripts ran per call, script microseconds)."""
    await gateway.call("bench", "warm")
    await store.client.config_resetstat()
    for _ in range(n):
        await gateway.call("bench", "x", est_tokens=15)
    stats = await store.client.info("commandstats")
    counts = {
        name.removeprefix("cmdstat_"): (int(value["calls"]), float(value["usec"]))
        for name, value in stats.items()
        if name.startswith("cmdstat_") and name not in {"cmdstat_config|resetstat"}
    }
    trips = {k: c / n for k, (c, _) in counts.items() if k in CLIENT_COMMANDS}
    inside = {k: c / n for k, (c, _) in counts.items() if k not in CLIENT_COMMANDS | {"info"}}
    script_us = counts.get("evalsha", (1, 0.0))[1] / max(1, counts.get("evalsha", (1, 0))[0])
    return dict(sorted(trips.items())), dict(sorted(inside.items())), script_us


async def memory_per_entity(store: RedisStore, gateway: Gateway) -> dict[str, int]:
    """Bytes per key after the run, with the permits set measured at 1 and 8 leases held."""
    usage: dict[str, int] = {}
    async for key in store.client.scan_iter(match=store.keys.pattern):
        usage[key] = int(await store.client.memory_usage(key) or 0)
    terms = gateway.plan("bench").terms["fast"]
    permits = store.keys.permits("fast")
    for held in range(1, 9):
        await store.admit(AdmitRequest("bench", (terms,), f"held-{held}"))
        if held in (1, 8):
            usage[f"{permits} ({held} held)"] = int(await store.client.memory_usage(permits) or 0)
    for rpm in (120, 10_000):  # a sliding window's log, full: one member per admission
        quota = QuotaTerms(f"full-{rpm}", rpm=rpm)
        source = SourceTerms(f"log-{rpm}", rpm, quota=quota)
        prefix = uuid.uuid4().hex[:16]  # permit ids as the loop makes them
        for n in range(rpm):
            await store.admit(AdmitRequest("bench", (source,), f"{prefix}-{n}"))
        log = store.keys.quota_log(quota.name)
        usage[f"{log} ({rpm} in the window)"] = int(await store.client.memory_usage(log) or 0)
    return usage


async def run(url: str, n: int) -> str:
    config = parse_config(CONFIG)
    source = InstantSource()
    redis_store = RedisStore.from_url(url, prefix=f"bench-{uuid.uuid4().hex[:8]}")
    on_redis = Gateway(config, {"fast": source}, store=redis_store)
    in_memory = Gateway(config, {"fast": source}, store=MemoryStore())
    try:
        trips, inside, script_us = await commands_per_call(redis_store, on_redis, n)
        bare = await timed(n, lambda: source.send("x", timeout_s=60))
        memory = await timed(n, lambda: in_memory.call("bench", "x", est_tokens=15))
        redis = await timed(n, lambda: on_redis.call("bench", "x", est_tokens=15))
        ping = await timed(n, redis_store.client.ping)
        usage = await memory_per_entity(redis_store, on_redis)
    finally:
        async for key in redis_store.client.scan_iter(match=redis_store.keys.pattern):
            await redis_store.client.delete(key)
        await redis_store.aclose()

    med_bare, p99_bare = statistics.median(bare), p(bare, 0.99)
    rows = [
        ("bare call (source only)", bare),
        ("governed, in-memory store", memory),
        ("governed, Redis store", redis),
        ("async PING, same client", ping),
    ]
    lines = [
        "# Redis store: governance overhead per call",
        "",
        f"{n} sequential calls per row against an instant source; Python "
        f"{sys.version.split()[0]}, redis at {url.rsplit('@', 1)[-1]}.",
        "",
        "## Redis round trips per successful uncontended call (INFO commandstats)",
        "",
        "| command sent by the client | per call |",
        "|---|---|",
        *(f"| {name} | {count:.2f} |" for name, count in trips.items()),
        f"| **total round trips** | **{sum(trips.values()):.2f}** |",
        "",
        f"Inside those two scripts Redis ran {sum(inside.values()):.0f} commands per call "
        f"({', '.join(f'{k} {v:.0f}' for k, v in inside.items())}), "
        f"{script_us:.1f} microseconds per script on the server.",
        "",
        "## Latency (microseconds)",
        "",
        "| what | median | p99 | overhead median | overhead p99 |",
        "|---|---|---|---|---|",
    ]
    for label, samples in rows:
        med, p99 = statistics.median(samples), p(samples, 0.99)
        governed = label.startswith("governed")
        over = (
            f"{(med - med_bare) * 1e6:.0f} | {(p99 - p99_bare) * 1e6:.0f}" if governed else "- | -"
        )
        lines.append(f"| {label} | {med * 1e6:.0f} | {p99 * 1e6:.0f} | {over} |")
    redis_over = statistics.median(redis) - med_bare
    ratio = redis_over / statistics.median(ping)
    lines += [
        "",
        f"Redis-store overhead / PING (medians): **{ratio:.2f}** (target at most 3).",
        "",
        "Where it goes: two script calls, each a loopback round trip (one PING) plus "
        "about a dozen encoded arguments and the script's own run time on the server "
        f"({script_us:.0f} us), then the loop itself (the in-memory row). Two round trips "
        "are the floor the design sets (admit before the request, settle after it); "
        "redis-py's per-command cost is most of the rest.",
        "",
        "## Memory per entity (MEMORY USAGE, bytes)",
        "",
        "| key | bytes |",
        "|---|---|",
        *(f"| `{key.split(':v1:', 1)[1]}` | {size} |" for key, size in sorted(usage.items())),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default=None, help="Redis URL (default: local or private)")
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    url = args.redis or reachable_redis()
    if url is not None:
        print(asyncio.run(run(url, args.calls)))
        return
    with RedisServer() as server:
        print(asyncio.run(run(server.url, args.calls)))


if __name__ == "__main__":
    main()
