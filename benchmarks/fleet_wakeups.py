"""Wake-ups under contention: what one acquisition costs as a fleet grows.

Run: ``.venv/bin/python benchmarks/fleet_wakeups.py [--processes 1,2,4,8,16,32]
[--callers 64] [--acquisitions 2000] [--label NAME] [--classes]`` (a private ``redis-server``,
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

``--classes`` runs the same fleet with two priority classes declared (interactive, and
batch with a floor of 0.1) and three tenants weighted 1:2:5: one caller in four
interactive, the tenants in turn (issue 38's cost: the fair queue's tags and the
floors' counters on every wait and hand-over).

``--semaphore fifo`` runs the same fleet, holds and waits on a plain FIFO list
semaphore instead (a list of `cap` tokens: ``BLPOP`` takes one, ``RPUSH`` puts it
back; no lease, no claim, no breaker, no adaptive limit): what first-come-first-served
order gives on this machine, scheduling delays included. Its commands are 2 per
acquisition by construction (the harness leaves ``BLPOP`` and ``RPUSH`` out of its
count, as its own), so the table says so rather than measuring them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._fleet import (  # noqa: E402
    act_as_worker,
    count_admissions,
    ready_then_wait,
    run_fleet,
)

HOLD_S = 0.0035
CAP = 4


# -- the worker process -----------------------------------------------------------------------


# With --classes: what the callers' calls carry, one caller in four interactive.
CLASSES: dict[str, Any] = {
    "priorities": {"interactive": {}, "batch": {"default": True, "min_share": 0.1}},
    "tenants": {"a": {"weight": 1}, "b": {"weight": 2}, "c": {"weight": 5}},
}
TENANTS = ("a", "b", "c")


async def worker(spec: dict[str, Any]) -> dict[str, Any]:
    from polygate_celery import Gateway, Outcome, parse_config  # noqa: PLC0415
    from polygate_celery.store.redis import RedisStore  # noqa: PLC0415

    waits: list[float] = []
    started_at: dict[int, float] = {}

    class HoldSource:
        async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
            task = id(asyncio.current_task())
            waits.append(time.perf_counter() - started_at[task])
            await asyncio.sleep(HOLD_S)
            return Outcome.success("ok")

    declared: dict[str, Any] = {
        "sources": {"w": {"max_concurrency": CAP, "timeout_s": 60}},
        "scopes": {"s": {"kind": "embedding", "sources": ["w"]}},
    }
    if spec.get("classes"):
        declared |= CLASSES
    config = parse_config(declared)
    store = RedisStore.from_url(spec["url"], prefix=spec["prefix"])
    counts = count_admissions(store)
    gateway = Gateway(config, {"w": HoldSource()}, store=store)
    await ready_then_wait(spec)
    cpu0 = time.process_time()

    async def caller(k: int) -> None:
        standing: dict[str, Any] = {}
        if spec.get("classes"):  # one caller in four interactive; the tenants in turn
            standing = {"priority": "interactive" if k % 4 == 0 else "batch"}
            standing["tenant"] = TENANTS[k % len(TENANTS)]
        for _ in range(spec["calls"]):
            started_at[id(asyncio.current_task())] = time.perf_counter()
            await gateway.call("s", "x", **standing)

    await asyncio.gather(*(asyncio.create_task(caller(k)) for k in range(spec["callers"])))
    cpu = time.process_time() - cpu0
    await gateway.aclose()
    await store.aclose()
    return {**counts, "cpu_s": cpu, "waits": waits}


async def fifo_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """The same callers and holds on a plain FIFO list semaphore (the comparison)."""
    from polygate_celery.store.redis import redis_client  # noqa: PLC0415

    client = redis_client(spec["url"], socket_timeout_s=600, connect_timeout_s=60)
    tokens = spec["tokens"]
    waits: list[float] = []
    await ready_then_wait(spec)
    cpu0 = time.process_time()

    async def caller() -> None:
        for _ in range(spec["calls"]):
            started = time.perf_counter()
            _, token = await client.blpop([tokens], timeout=0)
            waits.append(time.perf_counter() - started)
            await asyncio.sleep(HOLD_S)
            await client.rpush(tokens, token)

    await asyncio.gather(*(asyncio.create_task(caller()) for _ in range(spec["callers"])))
    cpu = time.process_time() - cpu0
    await client.aclose()
    n = len(waits)
    return {"admits": n, "granted": n, "cpu_s": cpu, "waits": waits}


def semaphore_worker(spec: dict[str, Any]) -> Any:
    return fifo_worker(spec) if spec.get("semaphore") == "fifo" else worker(spec)


# -- the run ----------------------------------------------------------------------------------


async def row(
    url: str,
    processes: int,
    callers: int,
    acquisitions: int,
    semaphore: str = "governed",
    classes: bool = False,
) -> dict[str, Any]:
    per_process = callers // processes
    calls = -(-acquisitions // (processes * per_process))
    prefix = f"wake-{uuid.uuid4().hex[:8]}"
    spec = {
        "prefix": prefix,
        "callers": per_process,
        "calls": calls,
        "semaphore": semaphore,
        "classes": classes,
        "tokens": f"{{{prefix}}}:tokens",
    }

    def tokens(client: Any) -> None:
        if semaphore == "fifo":
            client.rpush(spec["tokens"], *[f"t{i}" for i in range(CAP)])

    fleet = await run_fleet(__file__, url, spec, processes, before_go=tokens)
    results = fleet.results
    granted = sum(r["granted"] for r in results)
    refused = sum(r["admits"] - r["granted"] for r in results)
    waits = sorted(w for r in results for w in r["waits"])
    per_s = granted / fleet.elapsed_s
    return {
        "breakdown": {name: n / granted for name, n in fleet.commands.items()},
        "processes": processes,
        "callers": per_process,
        "acquisitions": granted,
        "per_s": per_s,
        "refused": refused / granted,
        "commands": 2.0 if semaphore == "fifo" else fleet.total_commands / granted,
        "redis_cpu_ms": 1000 * fleet.redis_cpu_s / granted,
        "worker_cpu_ms": 1000 * sum(r["cpu_s"] for r in results) / granted,
        "wait_p50_ms": 1000 * statistics.median(waits),
        "wait_p99_ms": 1000 * waits[min(len(waits) - 1, int(0.99 * len(waits)))],
        "wait_max_ms": 1000 * waits[-1],
        # In first-come-first-served order at this rate, a caller waits for the others
        # ahead of it: (callers - cap) acquisitions.
        "fifo_wait_ms": 1000 * (callers - CAP) / per_s,
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
        rows.append(
            await row(url, processes, args.callers, args.acquisitions, args.semaphore, args.classes)
        )
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
    parser.add_argument("--semaphore", choices=("governed", "fifo"), default="governed")
    parser.add_argument(
        "--classes",
        action="store_true",
        help="two priority classes (batch's floor 0.1) and three tenants weighted 1:2:5",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if act_as_worker(args.worker, semaphore_worker):
        return
    from tests.redis_server import RedisServer  # noqa: PLC0415

    with RedisServer() as server:
        print(asyncio.run(run(args, server.url)))
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"(all worker processes: {usage.ru_utime + usage.ru_stime:.1f} s CPU)", file=sys.stderr)


if __name__ == "__main__":
    main()
