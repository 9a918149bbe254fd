"""Quota fairness: how long callers wait for a shared rpm quota, and how often they ask.

Run: ``.venv/bin/python benchmarks/quota_fairness.py [--processes 4] [--callers 4]
[--calls 200] [--label NAME]`` (a private ``redis-server``; the simulator in this
process). Prints one Markdown table row; `benchmarks/results/quota_fairness.md` holds
the committed runs.

`processes` worker processes of `callers` callers each (16 in flight) make `calls`
chat calls in all, one after another per caller, against one source with the
package's defaults but ``max_concurrency = 16`` and ``rpm = 120`` (a bucket, the
default window); the simulated provider counts 120 RPM as a token bucket and answers
in 0.05-0.1 s. The quota, not the cap, is what callers wait for: after the first
minute's burst, two calls a second for 16 callers. Per row: the wait for a permit (from
a call's first ask of the store to its grant), median, p99 and the slowest, beside the
wait first-come-first-served order gives (16 callers / 2 per second = 8 s); refused
admissions per acquisition; the provider's refusals (429), which must be none; how long
a granted request took to reach the provider (admissions and arrivals matched in order:
the store keeps `ARRIVAL_MARGIN_S` of a bucket's refill for this).

``--errors 0.05 --side-by-side`` runs the workload three times, one after the other, with
the provider answering that share of requests with a 503: the package with the quota
declared, with it undeclared (learned from the provider's ``x-ratelimit-*`` headers),
a FIFO limiter of the kind Redis users write (`FIFO_LIMITER`: GCRA reservations, one
Lua script, the quota's burst, a refused or failed request reserving again, at the
back), and the package undeclared against a provider that announces nothing (it learns
only from 429s). Per row, each call's wait (the sum of its waits for admission, its
retries' included): median, p99 and slowest.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._fleet import (  # noqa: E402
    bucket_provider,
    chat_config,
    count_waits,
    fleet_args,
    ready_then_wait,
    report_on_a_private_redis,
    run_fleet,
)

CAP, RPM = 16, 120
LATENCY_S = (0.05, 0.1)

# The FIFO limiter: each request reserves the next free instant of a GCRA of RPM with a
# burst of RPM (a bucket as the provider's), in Redis TIME, and sleeps until it.
FIFO_LIMITER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local interval, tau = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local at = math.max(now, tat - tau)
redis.call('SET', KEYS[1], string.format('%.6f', math.max(tat, at) + interval))
return string.format('%.6f', at - now)
"""


def config(base_url: str, declared: bool = True) -> dict[str, Any]:
    found = chat_config(base_url, "fair-model", CAP, RPM)
    if not declared:
        del found["sources"]["sim"]["rpm"]
    return found


async def worker(spec: dict[str, Any]) -> dict[str, Any]:
    from polygate_celery import AllSourcesExhausted, Gateway, parse_config  # noqa: PLC0415
    from polygate_celery.store.redis import RedisStore, redis_client  # noqa: PLC0415

    store = RedisStore.from_url(spec["url"], prefix=spec["prefix"], socket_timeout_s=30)
    waits: list[float] = []
    admitted: list[float] = []  # store time (Redis TIME, seconds since the epoch)
    call_waits: Counter[str] = Counter()  # call id -> its waits for admission, summed

    def granted(request: Any, grant: Any, wait_s: float) -> None:
        waits.append(wait_s)
        admitted.append(grant.admitted_at)
        call_waits[request.call_id] += wait_s

    counts = count_waits(store, granted)
    gateway = Gateway(parse_config(config(spec["base_url"], spec["declared"])), store=store)
    client = redis_client(spec["url"], socket_timeout_s=600, connect_timeout_s=60)
    await ready_then_wait(spec)
    verdicts: Counter[str] = Counter()

    async def caller() -> None:
        while await client.decr(spec["left"]) >= 0:  # the calls left, fleet-wide
            try:
                await gateway.chat("summarise", [{"role": "user", "content": "summarise"}])
                verdicts["success"] += 1
            except AllSourcesExhausted as exc:
                verdicts[exc.reason] += 1

    await asyncio.gather(*(caller() for _ in range(spec["callers"])))
    await client.aclose()
    await gateway.aclose()
    return {
        **counts,
        "waits": waits,
        "call_waits": list(call_waits.values()),
        "admitted": admitted,
        "verdicts": dict(verdicts),
    }


async def fifo_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """The same callers behind `FIFO_LIMITER`: reserve, sleep, send; a 429 or 503
    reserves again."""
    import httpx  # noqa: PLC0415

    from polygate_celery.store.redis import redis_client  # noqa: PLC0415

    client = redis_client(spec["url"], socket_timeout_s=600, connect_timeout_s=60)
    reserve = client.register_script(FIFO_LIMITER)
    interval = 60.0 / RPM
    await ready_then_wait(spec)
    call_waits: list[float] = []
    statuses: Counter[int] = Counter()
    body = {"model": "fair-model", "messages": [{"role": "user", "content": "summarise"}]}
    async with httpx.AsyncClient(base_url=spec["base_url"], timeout=30) as http:

        async def caller() -> None:
            while await client.decr(spec["left"]) >= 0:
                waited = 0.0
                while True:
                    asked = time.monotonic()
                    wait_s = float(await reserve([spec["fifo"]], [interval, 60.0 - interval]))
                    await asyncio.sleep(wait_s)
                    waited += time.monotonic() - asked
                    answer = await http.post("/chat/completions", json=body)
                    statuses[answer.status_code] += 1
                    if answer.status_code == 200:
                        break
                call_waits.append(waited)

        await asyncio.gather(*(caller() for _ in range(spec["callers"])))
    await client.aclose()
    return {"call_waits": call_waits, "verdicts": {"success": statuses[200]}, "admits": 0}


async def any_worker(spec: dict[str, Any]) -> dict[str, Any]:
    return await (fifo_worker(spec) if spec["limiter"] == "fifo" else worker(spec))


async def run(url: str, processes: int, callers: int, calls: int, label: str) -> str:
    run_id = uuid.uuid4().hex[:8]
    with bucket_provider("fair-model", CAP, RPM, LATENCY_S) as provider:
        spec = {
            "base_url": provider.url,
            "prefix": f"fair-{run_id}",
            "left": f"bench:{run_id}:left",
            "callers": callers,
            "declared": True,
            "limiter": "polygate",
        }
        fleet = await run_fleet(
            __file__, url, spec, processes, before_go=lambda c: c.set(spec["left"], calls)
        )
        journal = provider.journal
        epoch = time.time() - provider.since_start()  # the journal's clock, as epoch seconds
    results, elapsed = fleet.results, fleet.elapsed_s
    waits = sorted(w for r in results for w in r["waits"])
    granted = sum(r["granted"] for r in results)
    refused = sum(r["admits"] - r["granted"] for r in results)
    verdicts = sum((Counter(r["verdicts"]) for r in results), Counter())
    refusals = sum(1 for e in journal if e.outcome.startswith("429"))
    # admissions and arrivals matched in order: how long a granted request took to arrive
    admissions = sorted(a for r in results for a in r["admitted"])
    arrivals = sorted(e.at + epoch for e in journal)
    lags = sorted(b - a for a, b in zip(admissions, arrivals, strict=False))
    in_flight = processes * callers
    fifo_s = in_flight / (RPM / 60.0)
    p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))]
    row = (
        f"| {label} | {processes} x {callers} | {dict(sorted(verdicts.items()))} | "
        f"{1000 * statistics.median(waits):.0f} / {1000 * p99:.0f} / {1000 * waits[-1]:.0f} ms "
        f"| {1000 * fifo_s:.0f} ms | {refused / max(granted, 1):.2f} | {refusals} "
        f"| {1000 * statistics.median(lags):.0f} / {1000 * lags[-1]:.0f} ms | {elapsed:.1f} s |"
    )
    if refusals or verdicts["success"] != calls:
        row += f"\n\n**FAILED**: {refusals} provider refusals, {dict(verdicts)}"
    return row


async def side_by_side(url: str, processes: int, callers: int, calls: int, errors: float) -> str:
    """The package, declared and undeclared, beside the FIFO limiter: one row each. The
    provider announces its limits as OpenAI does (``x-ratelimit-*``), but in the last
    row, where it says nothing until it refuses."""
    rows = [SIDE_HEADER]
    for name, limiter, declared, headers in (
        ("polygate_celery, rpm declared", "polygate", True, "openai"),
        ("polygate_celery, rpm undeclared (announced)", "polygate", False, "openai"),
        ("FIFO limiter (GCRA reservations), rpm declared", "fifo", True, "openai"),
        ("polygate_celery, rpm undeclared, no headers", "polygate", False, "none"),
    ):
        run_id = uuid.uuid4().hex[:8]
        with bucket_provider("fair-model", CAP, RPM, LATENCY_S, errors, headers) as provider:
            spec = {
                "base_url": provider.url,
                "prefix": f"fair-{run_id}",
                "left": f"bench:{run_id}:left",
                "fifo": f"{{fair-{run_id}}}:fifo",
                "callers": callers,
                "declared": declared,
                "limiter": limiter,
            }
            left = spec["left"]
            fleet = await run_fleet(
                __file__, url, spec, processes, before_go=lambda c, key=left: c.set(key, calls)
            )
            journal = provider.journal
        waits = sorted(w for r in fleet.results for w in r["call_waits"])
        served = sum(r["verdicts"].get("success", 0) for r in fleet.results)
        asks = sum(r["admits"] for r in fleet.results)
        refused = f"{(asks - len(journal)) / len(journal):.2f}" if asks else "-"
        statuses = Counter(str(e.status) for e in journal)
        p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))]
        rows.append(
            f"| {name} | {served} / {calls} | {statuses['503']} | {statuses['429']} "
            f"| {statistics.median(waits):.1f} / {p99:.1f} / {waits[-1]:.1f} s "
            f"| {refused} | {fleet.elapsed_s:.1f} s |"
        )
        if served != calls or (headers != "none" and limiter != "fifo" and statuses["429"]):
            rows.append(
                f"\n**FAILED** ({name}): {served} of {calls} calls served, "
                f"{statuses['429']} provider 429s\n"
            )
    return "\n".join(rows)


SIDE_HEADER = (
    "| limiter | calls served | provider 503s | provider 429s "
    "| wait per call p50 / p99 / slowest | refused admissions per request sent | run |"
    "\n|---|---|---|---|---|---|---|"
)


HEADER = (
    "| run | processes x callers | verdicts | wait p50 / p99 / slowest | FIFO wait "
    "| refused admissions per acquisition | provider 429s | admission to arrival p50 / max "
    "| run |\n|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--errors", type=float, default=0.0, help="share of 503 answers")
    parser.add_argument("--side-by-side", action="store_true")
    args = fleet_args(parser, any_worker)
    if args is None:
        return

    async def table(url: str) -> str:
        if args.side_by_side:
            return await side_by_side(url, args.processes, args.callers, args.calls, args.errors)
        return f"{HEADER}\n{await run(url, args.processes, args.callers, args.calls, args.label)}"

    report_on_a_private_redis(table, "a provider refusal, or a call that did not succeed")


if __name__ == "__main__":
    main()
