"""Celery's own queue priorities beside the package's classes, on the priority workload.

Run: ``.venv/bin/python benchmarks/celery_priorities.py [--brokers redis,rabbitmq]``
(a private ``redis-server`` as result backend, store and Redis broker; RabbitMQ at
127.0.0.1:5672 in a vhost of its own, made with ``rabbitmqctl``). Prints a Markdown
table; `benchmarks/results/priority.md` holds the committed run.

`priority.py`'s workload through real Celery workers: 4 worker processes (threads pool,
16 each: 64 tasks at once), one source with ``max_concurrency = 8`` and ``rpm = 600``
(a bucket at the provider too), answers in 0.2-0.4 s. 2,000 batch tasks are sent at
once, the broker's lowest priority; after the warm-up (the bucket's first burst spent),
interactive tasks at its highest: 100 over 20 s (half the quota), then 300 over 20 s.
Per broker, two runs: the broker's priorities alone (the governance knows no classes:
what a Celery user has today), and with the package's classes too (``interactive``
before ``batch``, batch's floor 0.1). Per row, interactive tasks' waits from sent to
their call's admission, and the part of it spent in the broker before a worker took the
task. The batch tasks left when the interactive ones are done are purged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._fleet import bucket_provider, chat_config, report_on_a_private_redis  # noqa: E402
from benchmarks.priority import CAP, LATENCY_S, PHASES, RPM  # noqa: E402
from benchmarks.priority import config as class_config  # noqa: E402

PROCESSES, THREADS = 4, 16
BATCH = 2000
WARMUP_S = 45.0
QUEUE = "bench-priority"


@contextlib.contextmanager
def workers(env: dict[str, str]) -> Iterator[None]:
    """`PROCESSES` Celery workers of the benchmark's app, stopped (cold) afterwards."""
    command = [
        sys.executable, "-m", "celery", "-A", "benchmarks._celery_priority_app", "worker",
        "-P", "threads", "-c", str(THREADS), "-Q", QUEUE, "--loglevel", "ERROR",
        "--without-heartbeat", "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    started = [
        subprocess.Popen(
            [*command, "-n", f"bench{i}-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        for i in range(PROCESSES)
    ]
    try:
        yield
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # what is left is purged
            process.wait(30)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(broker: str, backend: str, classes: bool, sizes: dict[str, float]) -> dict[str, Any]:
    """One run of the workload: the interactive tasks' results, by phase. `sizes`: the
    batch backlog, the warm-up and the share of each phase (1.0: as `PHASES`)."""
    high, low = (0, 9) if broker.startswith("redis") else (9, 0)
    run_id = uuid.uuid4().hex[:8]
    with (
        tempfile.TemporaryDirectory() as directory,
        bucket_provider("prio-model", CAP, RPM, LATENCY_S) as provider,
    ):
        from polygate_celery.demo.lifecycle import toml_text  # noqa: PLC0415

        config = (
            class_config(provider.url)
            if classes
            else chat_config(provider.url, "prio-model", CAP, RPM)
        )
        config["store"] = {"redis_url": backend, "key_prefix": f"cprio-{run_id}"}
        path = Path(directory) / "polygate.toml"
        path.write_text(toml_text(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLYGATE_")}
        env |= {
            "POLYGATE_CONFIG": str(path),
            "BENCH_BROKER": broker,
            "BENCH_BACKEND": backend,
            "BENCH_CLASSES": "1" if classes else "0",
        }
        os.environ.update({k: env[k] for k in ("BENCH_BROKER", "BENCH_BACKEND")})
        from benchmarks import _celery_priority_app as bench  # noqa: PLC0415 (its broker now)

        with bench.app.connection_for_write() as connection:
            for _ in range(int(sizes["batch"])):
                bench.summarise.apply_async(
                    (time.time(), "batch"), priority=low, connection=connection
                )
        with workers(env):
            time.sleep(sizes["warmup_s"])
            sent: list[tuple[str, Any]] = []
            for phase, full_count, full_s in PHASES:
                count, seconds = int(full_count * sizes["share"]), full_s * sizes["share"]
                for _ in range(count):
                    sent.append(
                        (phase, bench.summarise.apply_async((time.time(), "interactive"),
                                                            priority=high))
                    )  # fmt: skip
                    time.sleep(seconds / count)
            results = [(phase, r.get(timeout=300)) for phase, r in sent]
        bench.app.control.purge()  # the batch tasks left
    return {"results": results, "requests": len(provider.journal),
            "429s": sum(1 for e in provider.journal if e.status == 429)}  # fmt: skip


def table(rows: list[tuple[str, str, dict[str, Any]]]) -> str:
    lines = [
        "| broker | governance | phase | interactive admitted p50 / p99 / slowest "
        "| of it in the broker p50 / p99 | provider 429s |",
        "|---|---|---|---|---|---|",
    ]
    for broker, governance, found in rows:
        for phase, _, _ in PHASES:
            mine = [r for p, r in found["results"] if p == phase]
            waits = [r["admitted_s"] for r in mine]
            queued = [r["queued_s"] for r in mine]
            lines.append(
                f"| {broker} | {governance} | {phase} "
                f"| {statistics.median(waits):.2f} / {pct(waits, 0.99):.2f} / {max(waits):.2f} s "
                f"| {statistics.median(queued):.2f} / {pct(queued, 0.99):.2f} s "
                f"| {found['429s']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--brokers", default="redis,rabbitmq")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S)
    parser.add_argument("--share", type=float, default=1.0, help="of each phase's calls and time")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a run, in a process of its own
    args = parser.parse_args()
    if args.one:
        broker, backend, classes, sizes = json.loads(args.one)
        print(json.dumps(run(broker, backend, classes, sizes)))
        return
    sizes = {"batch": args.batch, "warmup_s": args.warmup_s, "share": args.share}
    brokers = args.brokers.split(",")

    async def report(url: str) -> str:
        rows = []
        for name in brokers:
            for classes in (False, True):
                with broker_url(name, url, 1 + classes) as broker:
                    found = await asyncio.to_thread(run_apart, broker, url, classes, sizes)
                governance = "classes" if classes else "no classes (FIFO)"
                rows.append((name, governance, found))
        return table(rows)

    report_on_a_private_redis(report, "an interactive task did not finish")


def run_apart(broker: str, backend: str, classes: bool, sizes: dict[str, float]) -> dict[str, Any]:
    """`run` in a process of its own (the app reads its broker once, on import)."""
    done = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps([broker, backend, classes, sizes])],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"a run failed:\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@contextlib.contextmanager
def broker_url(name: str, redis_url: str, database: int) -> Iterator[str]:
    """The broker to run on: the private Redis (`database`), or a RabbitMQ vhost of the
    run's own."""
    if name == "redis":
        yield f"{redis_url.rsplit('/', 1)[0]}/{database}"
        return
    from tests.celery.rabbitmq import rabbitmqctl  # noqa: PLC0415

    vhost = f"polygate-bench-{uuid.uuid4().hex[:8]}"
    if rabbitmqctl("add_vhost", vhost).returncode != 0:
        raise SystemExit("rabbitmqctl add_vhost failed: RabbitMQ is needed for its rows")
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


if __name__ == "__main__":
    main()
