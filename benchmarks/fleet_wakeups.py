"""Wake-ups under contention: what one acquisition costs as a fleet grows.

Run: ``.venv/bin/python benchmarks/fleet_wakeups.py [--processes 1,2,4,8,16,32]
[--callers 64] [--acquisitions 2000] [--label NAME]`` (a private ``redis-server``,
so its command counts and CPU are this run's alone). Prints a Markdown table;
`benchmarks/results/fleet_wakeups.md` holds the committed runs.

`callers` governed callers in all, shared out over `processes` worker processes,
contend for one source with ``max_concurrency = 4`` whose calls hold their permit
3.5 ms; every caller makes the same number of calls, with the package's default
settings (``poll_interval_s`` 1 s). Per row: acquisitions per second; refused
admissions per acquisition (admit scripts that did not grant, a caller's first ask
included); Redis commands per acquisition (every command the server ran: the
scripts' calls and the commands inside them, and the subscriptions); Redis CPU and
the workers' CPU per acquisition; the wait for a permit (from the call's start to
its source being called), median, p99 and the slowest, beside the wait strict
first-come-first-served order gives at the row's rate ((callers - cap) / rate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOLD_S = 0.0035
CAP = 4
HARNESS_TIMEOUT_S = 660.0  # the harness waits for slow starters (redis-py 8's default: 5 s)


# -- the worker process -----------------------------------------------------------------------


async def worker(spec: dict[str, Any]) -> dict[str, Any]:
    from polygate_celery import Gateway, Outcome, parse_config  # noqa: PLC0415
    from polygate_celery.store import Grant  # noqa: PLC0415
    from polygate_celery.store.redis import RedisStore, redis_client  # noqa: PLC0415

    waits: list[float] = []
    started_at: dict[int, float] = {}

    class HoldSource:
        async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
            task = id(asyncio.current_task())
            waits.append(time.perf_counter() - started_at[task])
            await asyncio.sleep(HOLD_S)
            return Outcome.success("ok")

    config = parse_config(
        {
            "sources": {"w": {"max_concurrency": CAP, "timeout_s": 60}},
            "scopes": {"s": {"kind": "embedding", "sources": ["w"]}},
        }
    )
    store = RedisStore.from_url(spec["url"], prefix=spec["prefix"])
    counts = {"admits": 0, "granted": 0}
    admit = store.admit

    async def counted(request: Any) -> Any:
        answer = await admit(request)
        counts["admits"] += 1
        counts["granted"] += isinstance(answer, Grant)
        return answer

    store.admit = counted  # type: ignore[method-assign]
    gateway = Gateway(config, {"w": HoldSource()}, store=store)
    client = redis_client(spec["url"], socket_timeout_s=600, connect_timeout_s=60)
    await client.rpush(spec["ready"], "1")
    await client.blpop([spec["go"]], timeout=600)
    await client.aclose()
    cpu0 = time.process_time()

    async def caller() -> None:
        for _ in range(spec["calls"]):
            started_at[id(asyncio.current_task())] = time.perf_counter()
            await gateway.call("s", "x")

    await asyncio.gather(*(asyncio.create_task(caller()) for _ in range(spec["callers"])))
    cpu = time.process_time() - cpu0
    await gateway.aclose()
    await store.aclose()
    return {**counts, "cpu_s": cpu, "waits": waits}


# -- the run ----------------------------------------------------------------------------------


def info(url: str, section: str) -> dict[str, Any]:
    import redis  # noqa: PLC0415

    with redis.Redis.from_url(
        url, decode_responses=True, socket_timeout=HARNESS_TIMEOUT_S
    ) as client:
        return dict(client.info(section))


async def row(url: str, processes: int, callers: int, acquisitions: int) -> dict[str, Any]:
    import redis  # noqa: PLC0415

    per_process = callers // processes
    calls = -(-acquisitions // (processes * per_process))
    run_id = uuid.uuid4().hex[:8]
    ready, go = f"bench:{run_id}:ready", f"bench:{run_id}:go"
    spec = {
        "url": url,
        "prefix": f"wake-{run_id}",
        "ready": ready,
        "go": go,
        "callers": per_process,
        "calls": calls,
    }
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", json.dumps(spec), stdout=subprocess.PIPE
        )
        for _ in range(processes)
    ]
    with redis.Redis.from_url(
        url, decode_responses=True, socket_timeout=HARNESS_TIMEOUT_S
    ) as client:
        for _ in range(processes):
            client.blpop([ready], timeout=600)
        client.config_resetstat()
        cpu_before = info(url, "cpu")
        began = time.perf_counter()
        client.rpush(go, *["go"] * processes)
        outputs = [await child.communicate() for child in children]
        elapsed = time.perf_counter() - began
        cpu_after = info(url, "cpu")
        stats = client.info("commandstats")
        client.delete(ready, go)
        for key in client.scan_iter(match=f"{{{spec['prefix']}}}*"):
            client.delete(key)
    results = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]
    granted = sum(r["granted"] for r in results)
    refused = sum(r["admits"] - r["granted"] for r in results)
    commands = sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.startswith("cmdstat_") and k not in {"cmdstat_info", "cmdstat_config|resetstat"}
    )
    command_names = {"rpush", "blpop", "del", "scan"}  # the harness's own, before and after
    commands -= sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in command_names)
    redis_cpu = sum(
        float(cpu_after[k]) - float(cpu_before[k]) for k in ("used_cpu_sys", "used_cpu_user")
    )
    waits = sorted(w for r in results for w in r["waits"])
    breakdown = {
        k.removeprefix("cmdstat_"): int(v["calls"]) / granted
        for k, v in stats.items()
        if k.startswith("cmdstat_")
        and k.removeprefix("cmdstat_") not in command_names
        and k not in {"cmdstat_info", "cmdstat_config|resetstat"}
    }
    return {
        "breakdown": breakdown,
        "processes": processes,
        "callers": per_process,
        "acquisitions": granted,
        "per_s": granted / elapsed,
        "refused": refused / granted,
        "commands": commands / granted,
        "redis_cpu_ms": 1000 * redis_cpu / granted,
        "worker_cpu_ms": 1000 * sum(r["cpu_s"] for r in results) / granted,
        "wait_p50_ms": 1000 * statistics.median(waits),
        "wait_p99_ms": 1000 * waits[min(len(waits) - 1, int(0.99 * len(waits)))],
        "wait_max_ms": 1000 * waits[-1],
        # In first-come-first-served order at this rate, a caller waits for the others
        # ahead of it: (callers - cap) acquisitions.
        "fifo_wait_ms": 1000 * (callers - CAP) / (granted / elapsed),
    }


def table(rows: list[dict[str, Any]], label: str) -> str:
    lines = [
        f"### {label}",
        "",
        "| processes x callers | acquisitions/s | refused admissions per acquisition "
        "| Redis commands per acquisition | Redis CPU per acquisition "
        "| worker CPU per acquisition | wait p50 / p99 / slowest | FIFO wait |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['processes']} x {r['callers']} | {r['per_s']:.0f} | {r['refused']:.2f} "
            f"| {r['commands']:.1f} | {r['redis_cpu_ms']:.2f} ms | {r['worker_cpu_ms']:.2f} ms "
            f"| {r['wait_p50_ms']:.0f} / {r['wait_p99_ms']:.0f} / {r['wait_max_ms']:.0f} ms "
            f"| {r['fifo_wait_ms']:.0f} ms |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace, url: str) -> str:
    rows = []
    for processes in (int(p) for p in args.processes.split(",")):
        rows.append(await row(url, processes, args.callers, args.acquisitions))
        print(rows[-1], file=sys.stderr, flush=True)
    head = (
        f"{args.callers} callers in all, cap {CAP}, {HOLD_S * 1000:.1f} ms holds, "
        f"{args.acquisitions} acquisitions per row; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, a private redis-server; load average at the end "
        f"{os.getloadavg()[0]:.1f}."
    )
    return f"{table(rows, args.label)}\n\n{head}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", default="1,2,4,8,16,32")
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--acquisitions", type=int, default=2000)
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(worker(json.loads(args.worker)))), flush=True)
        return
    from tests.redis_server import RedisServer  # noqa: PLC0415

    with RedisServer() as server:
        print(asyncio.run(run(args, server.url)))
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"(all worker processes: {usage.ru_utime + usage.ru_stime:.1f} s CPU)", file=sys.stderr)


if __name__ == "__main__":
    main()
