"""Governed Celery tasks at scale: deferral memory, parking-lot release lag, throughput.

Run: ``.venv/bin/python benchmarks/celery_deferral.py [--tasks 10000]``. Needs the
Redis at 127.0.0.1:6379 (``--redis`` for another); it uses database 10 only
(``--db``), refuses to start if that database holds keys, and empties it at the
end. Prints a Markdown report; `benchmarks/results/celery_deferral.md` is the
committed run. Every figure comes from real ``celery worker`` subprocesses
(`benchmarks/celery_bench_app.py`, with `configure_worker` applied) and the real
Redis broker:

1. worker RSS (``/proc/<pid>/status``) before and after `--tasks` governed tasks
   are deferred at once, for the ``park`` and the ``countdown`` strategies
   (solo pool: one process; target for park: growth at most 20 MB);
2. release lag of due parked tasks: the time from an entry's due time to its
   release, seen by polling the lot's sorted set (prefork -c 2; target p99 <= 1 s);
3. throughput of a governed no-op task over a plain Celery no-op task, same
   broker, pool and settings, interleaved in the same run (target >= 0.8); and,
   for information, one governed call to an instant source against a plain
   task making the same HTTP request with httpx.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import celery  # noqa: E402
import kombu  # noqa: E402
import redis as sync_redis  # noqa: E402
from celery import Celery  # noqa: E402

from benchmarks._processes import (  # noqa: E402
    clean_env,
    git,
    head_commit,
    log,
    start_process,
    stop_all,
    stop_process,
    track,
)
from polygate_celery import parse_config  # noqa: E402
from polygate_celery.celery import configure_worker  # noqa: E402
from polygate_celery.celery.parking import ParkingLot, lot_name  # noqa: E402
from polygate_celery.config.models import DeferralConfig  # noqa: E402
from polygate_celery.store.redis import KeySpace  # noqa: E402
from tests.celery.workers import toml  # noqa: E402

APP = "benchmarks.celery_bench_app"
APP_NAME = "polygate_bench"  # its Celery("polygate_bench"): a lot per app name and broker
TASK = {name: f"{APP}.{name}" for name in ("defer_once", "plain_noop", "governed_noop")}
TASK.update({name: f"{APP}.{name}" for name in ("plain_call", "governed_call")})
PARK_TARGET_MB = 20.0
LAG_TARGET_S = 1.0
RATIO_TARGET = 0.8
LONG_DEFERRAL_S = 120.0
DUE_SPREAD_S = 10.0
POLL_S = 0.02
# A confirmed entry is kept `release_check_s` ahead; a claimed one `claim_lease_s` ahead.
KEPT_AHEAD_S = (DeferralConfig().release_check_s + DeferralConfig().claim_lease_s) / 2
HORIZON_S = 1.0  # the lag poller reads entries due within this; a claim moves one 30 s out
MODEL = "instant"


class Simulator:
    """The simulated OpenAI-compatible provider, in its own process."""

    def __init__(self, tmp: Path) -> None:
        models = tmp / "models.json"
        models.write_text(json.dumps({MODEL: {}}))
        command = [sys.executable, "-m", "polygate_celery.testing.simulator", "--port", "0"]
        command += ["--config", str(models)]
        self.process = track(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=clean_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().decode().strip()
        if not self.url.startswith("http"):
            raise RuntimeError("the simulated provider did not start")


class Bench:
    """Broker, store and counters of one run, all in one Redis database."""

    def __init__(self, redis_url: str, db: int, tmp: Path, simulator_url: str) -> None:
        self.url = f"{redis_url.rstrip('/')}/{db}"
        self.redis = sync_redis.Redis.from_url(self.url)
        self.tmp = tmp
        self.simulator_url = simulator_url
        self.run_id = uuid.uuid4().hex[:8]
        self.client = Celery("polygate_bench_client", broker=self.url)  # no result backend
        self.client.conf.broker_connection_retry_on_startup = True
        self.applied: dict[str, Any] = {}
        self.config_data: dict[str, Any] = {}

    def config(self, prefix: str, strategy: str) -> dict[str, Any]:
        return {
            "store": {"redis_url": self.url, "key_prefix": prefix},
            "deferral": {
                "strategy": strategy,
                "growth": 1.0,
                "jitter": 0.0,
                "min_delay_s": 0.01,
                "max_delay_s": 600.0,
            },
            "sources": {
                "sim": {
                    "base_url": self.simulator_url,
                    "model": MODEL,
                    "timeout_s": 5.0,
                    "max_concurrency": 16,
                }
            },
            "scopes": {
                "bench": {"kind": "chat", "sources": ["sim"], "max_attempts": 2},
            },
        }

    @contextlib.contextmanager
    def worker(
        self,
        part: str,
        strategy: str,
        pool: str,
        concurrency: int,
        extra_env: dict[str, str] | None = None,
    ) -> Iterator[Worker]:
        prefix = f"bench-{self.run_id}-{part}"
        data = self.config(prefix, strategy)
        self.config_data = data
        path = self.tmp / f"{part}.toml"
        path.write_text(toml(data))
        probe = Celery("probe", broker=self.url)  # the settings configure_worker applies
        self.applied = configure_worker(probe, parse_config(data))
        queue = f"bench-{self.run_id}-{part}"
        env = {
            **clean_env(),
            "POLYGATE_CONFIG": str(path),
            "POLYGATE_BENCH_BROKER": self.url,
            "POLYGATE_BENCH_QUEUE": queue,
            "POLYGATE_BENCH_COUNTERS": f"{{{prefix}}}:bench",
            **(extra_env or {}),
        }
        command = [sys.executable, "-m", "celery", "-A", APP, "worker", "-P", pool]
        command += ["-c", str(concurrency), "-Q", f"{queue},{queue}-probe", "-n", f"{queue}@%h"]
        command += ["--loglevel", "WARNING", "--without-heartbeat", "--without-mingle"]
        command += ["--without-gossip"]
        logfile = self.tmp / f"{part}.log"
        process = start_process(command, env, logfile)
        worker = Worker(self, process, queue, prefix, logfile)
        try:
            yield worker
        except BaseException:
            tail = logfile.read_text(errors="replace")[-3000:] if logfile.exists() else ""
            log(f"worker {part} log tail:\n{tail}")
            raise
        finally:
            stop_process(process)
            self.redis.flushdb()  # this part's queue, results, lot and counters

    def send(self, name: str, queue: str, args: Callable[[int], list[Any]], n: int) -> list[str]:
        ids = [uuid.uuid4().hex for _ in range(n)]
        with self.client.producer_or_acquire() as producer:
            for i, task_id in enumerate(ids):
                self.client.send_task(
                    TASK[name], args=args(i), queue=queue, task_id=task_id, producer=producer
                )
        return ids


class Worker:
    def __init__(
        self, bench: Bench, process: subprocess.Popen[bytes], queue: str, prefix: str, log: Path
    ) -> None:
        self.bench = bench
        self.process = process
        self.queue = queue
        self.prefix = prefix
        self.logfile = log
        lot = lot_name(Celery(APP_NAME, broker=bench.url))  # the worker app's lot on this broker
        self.lot = ParkingLot(None, KeySpace(prefix), lot).keys[0]  # type: ignore[arg-type]
        self.probe_queue = f"{queue}-probe"

    def counter(self, name: str) -> int:
        return int(self.bench.redis.get(f"{{{self.prefix}}}:bench:{name}") or 0)

    def reset_counters(self) -> None:
        self.bench.redis.delete(f"{{{self.prefix}}}:bench:first", f"{{{self.prefix}}}:bench:again")

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the worker exited with {self.process.returncode}")

    def wait_for(self, what: str, done: Callable[[], bool], timeout_s: float) -> float:
        started = time.monotonic()
        while not done():
            self.alive()
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"{what}: not done after {timeout_s:.0f} s")
            time.sleep(0.05)
        return time.monotonic() - started


def rss_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


# -- 1. memory with N tasks deferred at once ------------------------------------------------


def memory_run(bench: Bench, strategy: str, n: int, eta_limit: bool = True) -> dict[str, Any]:
    part = f"mem-{strategy}" + ("" if eta_limit else "-nolimit")
    extra = {} if eta_limit else {"POLYGATE_BENCH_ETA_LIMIT": "none"}
    with bench.worker(part, strategy, "solo", 1, extra) as worker:
        warm = 300
        bench.send("defer_once", worker.queue, lambda i: [0.3], warm)
        worker.wait_for("warm-up", lambda: worker.counter("again") >= warm, 120)
        worker.wait_for("warm-up lot", lambda: bench.redis.zcard(worker.lot) == 0, 30)
        time.sleep(1.0)
        worker.reset_counters()
        before = rss_kb(worker.process.pid)
        started = time.monotonic()
        bench.send("defer_once", worker.queue, lambda i: [LONG_DEFERRAL_S], n)
        sent_s = time.monotonic() - started

        def progress() -> int:
            if strategy == "park":
                return int(bench.redis.zcard(worker.lot))
            return worker.counter("first")

        checkpoints, stalled = wait_deferred(worker, n, progress)
        took = time.monotonic() - started
        if strategy == "countdown":  # the worker goes on fetching the countdown copies
            wait_queue_still(worker, started)
        time.sleep(1.0)  # let what is in flight settle
        after = rss_kb(worker.process.pid)
        result = {
            "strategy": strategy,
            "eta_limit": eta_limit,
            "before_kb": before["VmRSS"],
            "after_kb": after["VmRSS"],
            "peak_kb": after["VmHWM"],
            "checkpoints": checkpoints,
            "first_runs": worker.counter("first"),
            "released": worker.counter("again"),
            "parked": int(bench.redis.zcard(worker.lot)),
            "queued": int(bench.redis.llen(worker.queue)),
            "unacked": int(bench.redis.hlen("unacked")),
            "send_s": sent_s,
            "took_s": took,
            "read_s": time.monotonic() - started,
            "stalled": stalled,
            "applied_eta_limit": bench.applied["worker_eta_task_limit"] if eta_limit else None,
        }
        result["probe_s"] = probe(bench, worker)
    log(f"memory {part}: {result}")
    return result


def wait_deferred(
    worker: Worker, n: int, progress: Callable[[], int], quiet_s: float = 5.0
) -> tuple[list[tuple[int, int]], bool]:
    """Wait for n deferrals, noting RSS (kB) at each quarter; True if progress stopped short."""
    marks = [n * q // 4 for q in (1, 2, 3, 4)]
    checkpoints: list[tuple[int, int]] = []
    started = last_change = time.monotonic()
    seen = -1
    while True:
        worker.alive()
        now = time.monotonic()
        done = progress()
        while marks and done >= marks[0]:
            checkpoints.append((marks.pop(0), rss_kb(worker.process.pid)["VmRSS"]))
        if done >= n:
            return checkpoints, False
        if done != seen:
            seen, last_change = done, now
        if now - last_change > quiet_s or now - started > LONG_DEFERRAL_S - 20:
            return checkpoints, True
        time.sleep(0.05)


def wait_queue_still(worker: Worker, started: float, quiet_s: float = 3.0) -> None:
    """Wait until the worker stops taking messages from its queue (or the first deferred
    tasks would soon be due)."""
    r = worker.bench.redis
    seen, since = r.llen(worker.queue), time.monotonic()
    while time.monotonic() - since < quiet_s and seen > 0:
        worker.alive()
        if time.monotonic() - started > LONG_DEFERRAL_S - 20:
            return
        time.sleep(0.1)
        now = r.llen(worker.queue)
        if now != seen:
            seen, since = now, time.monotonic()


def probe(bench: Bench, worker: Worker, limit_s: float = 10.0) -> float | None:
    """Seconds until a new no-op task on the worker's second queue has run (None: not in
    `limit_s`): whether a worker holding deferred tasks still takes new work."""
    (task_id,) = bench.send("plain_noop", worker.probe_queue, lambda i: [], 1)
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if bench.redis.exists(f"celery-task-meta-{task_id}"):
            return time.monotonic() - started
        time.sleep(0.02)
    return None


# -- 2. release lag of due parked tasks ------------------------------------------------------


def lag_run(bench: Bench, n: int, park_rate: float) -> dict[str, Any]:
    with bench.worker("lag", "park", "prefork", 2) as worker:
        warm = 100
        bench.send("defer_once", worker.queue, lambda i: [0.2], warm)
        worker.wait_for("warm-up", lambda: worker.counter("again") >= warm, 120)
        worker.wait_for("warm-up lot", lambda: bench.redis.zcard(worker.lot) == 0, 30)
        worker.reset_counters()
        # Every task is due in [window, window + spread); the window opens once all should
        # be parked (at the solo worker's parking rate, with a margin).
        window = time.time() + n / park_rate + 5.0
        rng = random.Random(7)
        dues = [window + rng.uniform(0, DUE_SPREAD_S) for _ in range(n)]
        started = time.monotonic()
        bench.send("defer_once", worker.queue, lambda i: [0.0, dues[i]], n)
        parked_by_window, park_s = wait_parked(worker, n, window - 0.5, started)
        lags = watch_releases(bench, worker, n, window + DUE_SPREAD_S + 90)
        worker.wait_for("second runs", lambda: worker.counter("again") >= n, 90)
        time.sleep(1.0)
        lags["parked_before_window"] = parked_by_window
        lags["park_s"] = park_s
        lags["first_runs"] = worker.counter("first")
        lags["second_runs"] = worker.counter("again")
        lags["left_in_lot"] = int(bench.redis.zcard(worker.lot))
    log(f"lag: { {k: v for k, v in lags.items() if not isinstance(v, list)} }")
    return lags


def wait_parked(worker: Worker, n: int, until: float, started: float) -> tuple[int, float | None]:
    """Wait until the epoch time `until`: (the lot's size then, seconds until it held n)."""
    park_s: float | None = None
    while time.time() < until:
        worker.alive()
        if park_s is None and worker.bench.redis.zcard(worker.lot) >= n:
            park_s = time.monotonic() - started
        time.sleep(0.05)
    return int(worker.bench.redis.zcard(worker.lot)), park_s


def watch_releases(bench: Bench, worker: Worker, n: int, deadline: float) -> dict[str, Any]:
    """Poll the lot every POLL_S: an entry's first-seen score is its due time; its release
    is the first poll that no longer finds it (an upper bound, at most one poll late)."""
    r = bench.redis
    due: dict[bytes, float] = {}
    claimed_at: dict[bytes, float] = {}
    released_at: dict[bytes, float] = {}
    watching: set[bytes] = set()
    polls, poll_cost = 0, 0.0
    while len(released_at) < n and time.time() < deadline:
        worker.alive()
        began = time.time()
        rows = r.zrangebyscore(worker.lot, "-inf", began + HORIZON_S, withscores=True)
        current = set()
        for member, score in rows:
            current.add(member)
            if member not in due and member not in released_at:
                due[member] = score
                watching.add(member)
        gone = [m for m in watching if m not in current]
        if gone:
            scores = r.zmscore(worker.lot, gone)
            now = time.time()
            for member, score in zip(gone, scores, strict=True):
                # Released: confirmed, so deleted (an older lot) or kept until its run
                # begins, its score moved `release_check_s` ahead (a claim moves it
                # only `claim_lease_s` ahead).
                if score is None or score >= now + KEPT_AHEAD_S:
                    released_at[member] = now
                    watching.discard(member)
                else:
                    claimed_at.setdefault(member, now)
        if not rows and not watching and r.zcard(worker.lot) == 0 and len(due) > 0:
            break  # nothing left anywhere
        polls += 1
        cost = time.time() - began
        poll_cost += cost
        time.sleep(max(0.0, POLL_S - cost))
    lag = [released_at[m] - due[m] for m in released_at]
    claim = [claimed_at[m] - due[m] for m in claimed_at if m in released_at]
    return {
        "lag": lag,
        "claim_lag": claim,
        "observed": len(due),
        "released": len(released_at),
        "never_released": len(watching),
        "polls": polls,
        "poll_ms": 1000 * poll_cost / max(1, polls),
    }


# -- 3. throughput ---------------------------------------------------------------------------


class Completions:
    """Counts SUCCESS results of expected task ids, from the result backend's publishes."""

    def __init__(self, url: str) -> None:
        self.pubsub = sync_redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe("celery-task-meta-*")
        self.pending: set[str] = set()
        self.failed = 0
        self.last = 0.0
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.stopped = False
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def expect(self, ids: list[str]) -> None:
        with self.lock:
            self.pending = set(ids)
            self.failed = 0
            self.done.clear()

    def _listen(self) -> None:
        while not self.stopped:
            message = self.pubsub.get_message(timeout=0.2)
            if message is None:
                continue
            task_id = message["channel"].decode()[len("celery-task-meta-") :]
            with self.lock:
                if task_id not in self.pending:
                    continue
                data = message["data"]
                if b'"SUCCESS"' not in data:
                    if b'"FAILURE"' in data:
                        self.failed += 1
                    else:
                        continue
                self.pending.discard(task_id)
                self.last = time.perf_counter()
                if not self.pending:
                    self.done.set()

    def close(self) -> None:
        self.stopped = True
        self.thread.join(2)
        self.pubsub.close()


def throughput_run(
    bench: Bench, completions: Completions, worker: Worker, name: str, n: int, args: list[Any]
) -> float:
    ids = [uuid.uuid4().hex for _ in range(n)]
    completions.expect(ids)
    started = time.perf_counter()
    with bench.client.producer_or_acquire() as producer:
        for task_id in ids:
            bench.client.send_task(
                TASK[name], args=args, queue=worker.queue, task_id=task_id, producer=producer
            )
    while not completions.done.wait(0.5):
        worker.alive()
        if time.perf_counter() - started > 300:
            raise TimeoutError(f"{name}: {len(completions.pending)} of {n} not done")
    if completions.failed:
        raise RuntimeError(f"{name}: {completions.failed} tasks failed")
    return n / (completions.last - started)


def throughput(bench: Bench, n: int, n_call: int, rounds: int) -> dict[str, Any]:
    pairs = [("plain_noop", "governed_noop", n, []), ("plain_call", "governed_call", n_call, [])]
    rates: dict[str, list[float]] = {name: [] for p in pairs for name in p[:2]}
    completions = Completions(bench.url)
    try:
        with bench.worker("tput", "park", "prefork", 2) as worker:
            call_args = {"plain_call": [bench.simulator_url, MODEL]}
            for name in rates:  # warm-up: both processes, every client and connection
                throughput_run(bench, completions, worker, name, 200, call_args.get(name, []))
            for plain, governed, count, _ in pairs:
                for r in range(rounds):
                    order = (plain, governed) if r % 2 == 0 else (governed, plain)
                    for name in order:
                        rate = throughput_run(
                            bench, completions, worker, name, count, call_args.get(name, [])
                        )
                        rates[name].append(rate)
                        log(f"throughput {name}: {rate:.0f} tasks/s")
    finally:
        completions.close()
    return {"rates": rates, "n": n, "n_call": n_call, "rounds": rounds}


# -- report ----------------------------------------------------------------------------------


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def verdict(ok: bool) -> str:
    return "**PASS**" if ok else "**MISS**"


def mb(kb: int) -> str:
    return f"{kb / 1024:.1f}"


def machine(bench: Bench) -> str:
    info = bench.redis.info("server")
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = ""
    with contextlib.suppress(OSError, IndexError, ValueError):
        total = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        memory = f", {int(total) / 1024 / 1024:.1f} GiB RAM"
    return (
        f"{os.cpu_count()} cores ({cpu}){memory}, Linux {platform.release()}; "
        f"Python {platform.python_version()}, Celery {celery.__version__}, "
        f"kombu {kombu.__version__}, redis-py {sync_redis.__version__}; "
        f"Redis {info['redis_version']} at {bench.url.rsplit('@', 1)[-1]} "
        f"(broker, result backend and governance store, one database)"
    )


def package_version() -> str:
    """The commit measured, and whether the package's files differed from it."""
    commit = head_commit()
    dirty = git("status", "--porcelain", "polygate_celery")
    if dirty is None:
        return "polygate_celery (no git)"
    state = " with local changes to polygate_celery/" if dirty else ""
    return f"polygate_celery at commit {commit or 'unknown'}{state}"


def version_line(at_start: str) -> str:
    at_end = package_version()
    if at_end == at_start:
        return at_end
    return f"**changed during the run**: {at_start} at the start, {at_end} at the end"


def report(
    bench: Bench,
    n: int,
    memory: list[dict[str, Any]],
    lag: dict[str, Any],
    lag_n: int,
    tput: dict[str, Any],
    elapsed_s: float,
    version_at_start: str,
) -> str:
    park = next(m for m in memory if m["strategy"] == "park")
    countdown = next(m for m in memory if m["strategy"] == "countdown" and m["eta_limit"])
    growth = {id(m): (m["after_kb"] - m["before_kb"]) / 1024 for m in memory}
    lags = lag["lag"]
    rates = tput["rates"]
    med = {name: statistics.median(values) for name, values in rates.items()}
    noop_ratio = med["governed_noop"] / med["plain_noop"]
    call_ratio = med["governed_call"] / med["plain_call"]
    p99 = pct(lags, 0.99) if lags else float("inf")
    lost = lag_n - lag["second_runs"]
    deferral = bench.config_data["deferral"]
    lines = [
        "# Celery deferral: worker memory, release lag, governed-task throughput",
        "",
        f"Machine: {machine(bench)}.",
        "",
        f"Package: {version_line(version_at_start)}.",
        "",
        f"Run: `.venv/bin/python benchmarks/celery_deferral.py --tasks {n}`, "
        f"{elapsed_s / 60:.1f} minutes end to end. Workers are real `celery worker` "
        "subprocesses of `benchmarks/celery_bench_app.py` (`configure_worker` applied, "
        "`--without-heartbeat --without-mingle --without-gossip`).",
        "",
        "## Summary",
        "",
        "| measure | figure | target | |",
        "|---|---|---|---|",
        f"| worker RSS growth, {n:,} tasks deferred at once, `park` | "
        f"{growth[id(park)]:.1f} MB | at most {PARK_TARGET_MB:g} MB | "
        f"{verdict(growth[id(park)] <= PARK_TARGET_MB)} |",
        f"| worker RSS growth, {n:,} tasks deferred at once, `countdown` "
        f"(`worker_eta_task_limit` = {countdown['applied_eta_limit']}, as `configure_worker` "
        f"sets it) | {growth[id(countdown)]:.1f} MB | none (for comparison) | - |",
        f"| release lag of due parked tasks, p99 ({lag_n:,} tasks due over "
        f"{DUE_SPREAD_S:g} s) | {p99:.3f} s | at most {LAG_TARGET_S:g} s | "
        f"{verdict(p99 <= LAG_TARGET_S and lost == 0)} |",
        f"| **governed no-op task ÷ plain Celery no-op task**, throughput | "
        f"{noop_ratio:.2f} | at least {RATIO_TARGET} | {verdict(noop_ratio >= RATIO_TARGET)} |",
        f"| governed task with one governed call ÷ plain task with one httpx call "
        f"(information only) | {call_ratio:.2f} | none | - |",
        "",
        f"## 1. Worker memory with {n:,} tasks deferred at once",
        "",
        "One worker, solo pool (one process). Warm-up: 300 tasks deferred by 0.3 s, released "
        "and run again. Then RSS (`VmRSS` of `/proc/<pid>/status`) is read, "
        f"{n:,} `defer_once` tasks are sent at once (each body raises "
        f"`AllSourcesExhausted('stalled', 'bench', {LONG_DEFERRAL_S:g})` when its "
        "`polygate_deferrals` header is 0, so every task defers on its first run), and RSS "
        f"is read again once all {n:,} have been deferred (park: the lot's sorted set, "
        f"`{{<prefix>}}:v1:parked:{APP_NAME}@<broker>`, holds "
        f"{n:,} entries; countdown: {n:,} first runs counted in Redis, then until the worker "
        "has taken no message from its queue for 3 s, since it goes on fetching the "
        "countdown copies), after a 1 s settle. Peak is `VmHWM`. Then a new no-op task is "
        "sent to a second queue the worker consumes (new-task probe: seconds until it ran, "
        "10 s at most).",
        "",
        "| strategy | RSS before MB | RSS after MB | growth MB | peak MB | first runs "
        "(deferred) | in the lot | in the queue | unacked (held by the worker) "
        "| released early | all deferred after | RSS read after | new-task probe |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in memory:
        took = f"{m['took_s']:.1f} s" + (" (stopped short)" if m["stalled"] else "")
        probe_s = "did not run" if m["probe_s"] is None else f"{m['probe_s']:.2f} s"
        lines.append(
            f"| {memory_label(m)} | {mb(m['before_kb'])} | {mb(m['after_kb'])} | "
            f"{growth[id(m)]:.1f} | {mb(m['peak_kb'])} | {m['first_runs']:,} | {m['parked']:,} "
            f"| {m['queued']:,} | {m['unacked']:,} | {m['released']} | {took} "
            f"| {m['read_s']:.1f} s | {probe_s} |"
        )
    marks = [n * q // 4 for q in (1, 2, 3, 4)]
    lines += [
        "",
        "RSS growth over the deferral (MB above the reading before), by tasks deferred:",
        "",
        "| strategy | " + " | ".join(f"{mark:,}" for mark in marks) + " | after |",
        "|---|" + "---|" * (len(marks) + 1),
    ]
    for m in memory:
        points = dict(m["checkpoints"])
        cells = [
            f"{(points[mark] - m['before_kb']) / 1024:.1f}" if mark in points else "-"
            for mark in marks
        ]
        lines.append(f"| {memory_label(m)} | {' | '.join(cells)} | {growth[id(m)]:.1f} |")
    lines += [
        "",
        *memory_notes(memory, n),
        "",
        "## 2. Release lag of due parked tasks",
        "",
        f"{lag_n:,} `defer_once` tasks, each given a due time drawn uniformly from a "
        f"{DUE_SPREAD_S:g} s window that opens once all should be parked; the body defers by "
        "`due_at - now`, and with `jitter` 0, `growth` 1 and `min_delay_s` 0.01 the parked "
        "entry's score is that due time. One worker, prefork pool, `-c 2` (each child runs "
        "a release loop, started by `worker_process_init`), "
        f"`release_interval_s` {deferral.get('release_interval_s', 0.2)} and "
        f"`release_batch` {deferral.get('release_batch', 200)} (the defaults). "
        "The benchmark polls the lot (`{<prefix>}:v1:parked:polygate_bench@<broker>`) with "
        f"`ZRANGEBYSCORE lot -inf now+{HORIZON_S:g} WITHSCORES` every "
        f"{POLL_S * 1000:.0f} ms (plus `ZMSCORE` of the entries it watches that left that "
        "range): an entry's first-seen score is its due time (a claim moves the score to "
        "the lease end), and its release is the first poll that finds it gone or kept (the "
        "releaser confirms by keeping it `release_check_s` ahead until its run begins), "
        "so a lag is an upper bound, late by at most one "
        f"poll (a poll took {lag['poll_ms']:.1f} ms on average). Claim lag: the first poll "
        "that saw the entry's score moved; entries claimed and released between two polls "
        "have none, so that row covers only the slower releases.",
        "",
        "| | median | p95 | p99 | max | samples |",
        "|---|---|---|---|---|---|",
    ]
    claim_label = "claim lag s (only entries seen claimed before their release)"
    for label, samples in (("release lag s", lags), (claim_label, lag["claim_lag"])):
        if samples:
            lines.append(
                f"| {label} | {statistics.median(samples):.3f} | {pct(samples, 0.95):.3f} | "
                f"{pct(samples, 0.99):.3f} | {max(samples):.3f} | {len(samples):,} |"
            )
    parking = (
        f"all {lag_n:,} were parked {lag['park_s']:.1f} s after the first send, by two processes"
        if lag["park_s"] is not None
        else "not all were parked before the window opened"
    )
    lines += [
        "",
        f"Parked before the window opened: {lag['parked_before_window']:,} of {lag_n:,} "
        f"({parking}). Entries observed: "
        f"{lag['observed']:,}; released: {lag['released']:,}; never released: "
        f"{lag['never_released']}. Runs counted by the task body: {lag['first_runs']:,} first "
        f"runs, {lag['second_runs']:,} second runs ({lost} lost); left in the lot: "
        f"{lag['left_in_lot']}.",
        "",
        "## 3. Throughput: governed against plain, same broker, pool and settings",
        "",
        f"One worker, prefork pool `-c 2`, serving both tasks of each pair. Per run, N tasks "
        "are sent at once (one producer, `send_task`) and the time runs from the first send "
        "to the last SUCCESS the result backend publishes (the benchmark listens on "
        "`celery-task-meta-*`). Runs are interleaved (plain, governed, then governed, "
        f"plain, ...), {tput['rounds']} of each; figures are medians in tasks per second, "
        "after a warm-up run of 200 of each task.",
        "",
        "| task | N per run | runs (tasks/s) | median tasks/s | governed ÷ plain |",
        "|---|---|---|---|---|",
    ]
    for name, count, ratio in (
        ("plain_noop", tput["n"], None),
        ("governed_noop", tput["n"], noop_ratio),
        ("plain_call", tput["n_call"], None),
        ("governed_call", tput["n_call"], call_ratio),
    ):
        runs = ", ".join(f"{r:.0f}" for r in rates[name])
        shown = "-" if ratio is None else f"**{ratio:.2f}**"
        lines.append(f"| `{name}` | {count:,} | {runs} | {med[name]:.0f} | {shown} |")
    lines += [
        "",
        "The target (at least 0.8) applies to the no-op ratio: `governed_noop` is "
        "`@governed('bench')` over a body that returns at once, `plain_noop` a plain "
        "`@app.task` doing the same. `governed_call` makes one governed chat call "
        "(`calls.chat`) to an instant model of `polygate_celery.testing.simulator` "
        "(a separate process, zero latency); `plain_call` posts the same request to the same "
        "model with one `httpx.Client` per process. Their ratio is information only: it "
        "includes the governance loop's two Redis script calls per call.",
        "",
        "## Settings",
        "",
        "Gateway configuration of every worker (the key prefix differs per part; part 1's "
        'countdown row sets `deferral.strategy = "countdown"`):',
        "",
        "```toml",
        shown_config(bench.config_data),
        "```",
        "",
        "Settings `configure_worker` applied (defaults `calls_per_task` 1, `extra_task_s` 60, "
        "`visibility_margin_s` 300):",
        "",
        "```json",
        json.dumps(bench.applied, indent=1, sort_keys=True, default=str),
        "```",
    ]
    return "\n".join(lines)


def shown_config(data: dict[str, Any]) -> str:
    """The configuration as TOML, with the run's own prefix and port left out."""
    source = {**data["sources"]["sim"], "base_url": "http://127.0.0.1:<port>/v1"}
    shown = {
        **data,
        "store": {**data["store"], "key_prefix": "bench-<run>-<part>"},
        "sources": {"sim": source},
    }
    return re.sub(r"\n{3,}", "\n\n", toml(shown)).strip()


def memory_label(m: dict[str, Any]) -> str:
    label = f"`{m['strategy']}`"
    if m["strategy"] == "countdown":
        if m["eta_limit"]:
            label += f", `worker_eta_task_limit` = {m['applied_eta_limit']} (`configure_worker`)"
        else:
            label += ", `worker_eta_task_limit` unset (information only)"
    return label


def memory_notes(memory: list[dict[str, Any]], n: int) -> list[str]:
    notes = []
    for m in memory:
        if m["released"]:
            notes.append(
                f"- {memory_label(m)}: {m['released']} tasks ran a second time during the "
                "measurement (expected none)."
            )
        if m["first_runs"] < n:
            notes.append(
                f"- {memory_label(m)}: only {m['first_runs']:,} of {n:,} tasks had run (and "
                f"been deferred) when progress stopped."
            )
        ran = "did not run" if m["probe_s"] is None else f"ran in {m['probe_s']:.2f} s"
        if m["strategy"] == "park":
            notes.append(
                f"- {memory_label(m)}: the worker held {m['unacked']:,} messages; the "
                f"{m['parked']:,} deferred tasks wait in Redis. A new task on its other queue "
                f"{ran}."
            )
        if m["strategy"] == "countdown":
            held = (
                f"- {memory_label(m)}: the worker held {m['unacked']:,} countdown copies "
                f"(unacknowledged, in its memory until due) and left {m['queued']:,} in the "
                "queue."
            )
            if m["probe_s"] is not None:
                held += f" A new task on its other queue {ran}."
            else:
                held += (
                    " A new task on its other queue did not run within 10 s: every prefetch "
                    "slot was taken by a countdown copy, so the worker takes no new work "
                    f"until those come due ({LONG_DEFERRAL_S:g} s after their deferral)."
                )
            notes.append(held)
    if not any(m["released"] or m["first_runs"] < n for m in memory):
        notes.append(f"- Every run deferred all {n:,} tasks; none ran a second time early.")
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks deferred at once")
    parser.add_argument("--lag-tasks", type=int, default=None, help="default: --tasks")
    parser.add_argument("--throughput-tasks", type=int, default=3000)
    parser.add_argument("--call-tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4, help="throughput runs of each task")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=10)
    parser.add_argument(
        "--no-eta-limit-run",
        action="store_true",
        help="skip the informational countdown run without worker_eta_task_limit",
    )
    args = parser.parse_args()
    lag_n = args.lag_tasks or args.tasks

    def interrupted(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    version = package_version()
    probe = sync_redis.Redis.from_url(f"{args.redis.rstrip('/')}/{args.db}")
    if probe.dbsize():
        sys.exit(f"Redis database {args.db} holds keys; it must be empty (use --db)")
    with tempfile.TemporaryDirectory(prefix="polygate-bench-") as tmp:
        bench: Bench | None = None
        try:
            simulator = Simulator(Path(tmp))
            bench = Bench(args.redis, args.db, Path(tmp), simulator.url)
            memory = [memory_run(bench, "park", args.tasks)]
            park_rate = args.tasks / memory[0]["took_s"]
            memory.append(memory_run(bench, "countdown", args.tasks))
            if not args.no_eta_limit_run:
                memory.append(memory_run(bench, "countdown", args.tasks, eta_limit=False))
            lag = lag_run(bench, lag_n, park_rate)
            tput = throughput(bench, args.throughput_tasks, args.call_tasks, args.rounds)
            elapsed = time.monotonic() - started
            print(report(bench, args.tasks, memory, lag, lag_n, tput, elapsed, version))
        finally:
            stop_all()
            if bench is not None:
                bench.redis.flushdb()
            log(f"done in {time.monotonic() - started:.0f} s; database {args.db} emptied")


if __name__ == "__main__":
    main()
