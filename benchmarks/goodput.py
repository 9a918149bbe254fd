"""Goodput under a provider quota, with and without an outage: four ways to call a model.

Run: ``.venv/bin/python benchmarks/goodput.py`` (``make bench``). Needs a Redis
(``--redis``, default 127.0.0.1:6379); it uses database 11 only (``--db``),
refuses to start if that database holds keys, and empties it after each run.
Writes ``benchmarks/RESULTS.md`` and one PNG per scenario under
``benchmarks/results/`` (``--out``, ``--plots``).

The workload is fixed (the defaults below): 300 chat tasks sent at once to 2
``celery worker`` processes of 8 threads each (16 in flight), against the
simulated provider in this process, modelled on real ones: an RPM quota of 120
for the key as a token bucket refilled continuously, rate-limit headers on every
answer and a truthful Retry-After on every 429, 5 % of admitted requests
answered 503, 200 ms per answer. Scenarios (`SCENARIOS`): `steady`; `outage`,
the same plus a 60 s total outage (every request answered 503 at once) centred
on the middle of the ideal run; then polygate_celery alone with no rpm declared
(`undeclared`, OpenAI-style headers; `undeclared-anthropic`), and against a
provider that counts in 60 s windows (`window`, no `rpm_window` declared: its
resets show the windows), each with the defaults. Every
contender (`benchmarks/goodput_app.py`) runs the same workload on fresh workers,
a fresh provider and a fresh database.

Ideal finish time: failed answers are charged to the quota too, so N tasks need
about A = ceil(N / (1 - p)) admitted requests. A bucket of Q starts full and
refills one request every 60 / Q s, so the k-th admitted request (k = 0, 1, ...)
cannot start before max(0, k - Q + 1) * 60 / Q s and nothing can finish before
T = max(0, A - Q) * 60 / Q s + L (L the answer latency); a window admits Q in any
60 s, so T = floor((A - 1) / Q) * 60 s + L. The outage adds its length D. For
the defaults: A = 316, T = 98.2 s (bucket), 158.2 s with the outage, 120.2 s
(window).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import celery  # noqa: E402
import redis as sync_redis  # noqa: E402
from celery import Celery  # noqa: E402

from benchmarks._processes import clean_env, log, start_process, stop_process  # noqa: E402
from polygate_celery import embedded  # noqa: E402
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider  # noqa: E402
from tests.celery.workers import toml  # noqa: E402

APP = "benchmarks.goodput_app"
MODEL = "chat"
KEY = "sk-goodput-bench"
CONTENDERS = {
    "openai_default": "openai client, default retries",
    "celery_autoretry": "Celery autoretry_for + retry_backoff",
    "tenacity_retry": "tenacity wait_random_exponential",
    "polygate": "polygate_celery",
}
SAMPLE_S = 0.1
DONE_STATES = {"SUCCESS", "FAILURE"}


@dataclass(frozen=True)
class Scenario:
    """A provider, whether it has an outage, and whether the governed contender
    declares the provider's quota (`rpm`) or learns it from the headers."""

    limiter: str = "bucket"  # the simulator's rate_limiter: "bucket" or "window"
    headers: str = "openai"  # the simulator's ratelimit_headers
    outage: bool = False
    declared: bool = True
    everyone: bool = True  # every contender runs it, else polygate_celery alone
    about: str = ""


SCENARIOS = {
    "steady": Scenario(about="token-bucket provider, rpm declared"),
    "outage": Scenario(outage=True, about="the same with a total outage"),
    "undeclared": Scenario(
        declared=False, everyone=False, about="no rpm declared: learned from OpenAI-style headers"
    ),
    "undeclared-anthropic": Scenario(
        headers="anthropic",
        declared=False,
        everyone=False,
        about="no rpm declared: learned from Anthropic-style headers",
    ),
    "window": Scenario(
        limiter="window",
        everyone=False,
        about="a provider that counts in 60 s windows, rpm declared, no window declared",
    ),
}


@dataclass(frozen=True)
class Workload:
    tasks: int = 300
    workers: int = 2
    threads: int = 8
    rpm: int = 120
    error_rate: float = 0.05
    latency_s: float = 0.2
    outage_s: float = 60.0
    seed: int = 0

    @property
    def capacity(self) -> float:
        """Requests per second the quota allows over a long run."""
        return self.rpm / 60.0

    @property
    def admitted_needed(self) -> int:
        return math.ceil(self.tasks / (1.0 - self.error_rate))

    def ideal_s(self, scenario: Scenario) -> float:
        admitted = self.admitted_needed
        if scenario.limiter != "bucket":
            start = (admitted - 1) // self.rpm * 60.0
            return start + self.latency_s + (self.outage_s if scenario.outage else 0.0)
        per_s = self.rpm / 60.0
        if scenario.outage:
            # A saturated bucket is empty when the outage begins and refills during it (up
            # to its size): what was not sent during the outage is sent at once after it.
            begin, end = self.outage_window()
            before = self.rpm + begin * per_s
            if admitted > before:
                refilled = min(self.rpm, (end - begin) * per_s)
                return end + max(0.0, admitted - before - refilled) / per_s + self.latency_s
        return max(0, admitted - self.rpm) / per_s + self.latency_s

    def outage_window(self) -> tuple[float, float]:
        middle = self.ideal_s(SCENARIOS["steady"]) / 2
        return (middle - self.outage_s / 2, middle + self.outage_s / 2)

    def behaviour(self, scenario: Scenario) -> ModelBehaviour:
        return ModelBehaviour(
            rpm=self.rpm,
            rate_limiter=scenario.limiter,  # type: ignore[arg-type]
            ratelimit_headers=scenario.headers,  # type: ignore[arg-type]
            error_rates={503: self.error_rate} if self.error_rate else {},
            latency_s=(self.latency_s, self.latency_s),
            outages=(self.outage_window(),) if scenario.outage else (),
            retry_after="seconds",
            api_key=KEY,
        )


@dataclass
class Run:
    """The figures of one contender in one scenario."""

    contender: str
    scenario: str
    tasks: int
    completed: int = 0
    failed: int = 0
    lost: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    attempts: int = 0
    rate_limited: int = 0
    server_errors: int = 0
    finish_s: float | None = None
    executions: int = 0
    worker_s: float = 0.0
    request_s: float = 0.0
    deferrals: int = 0
    stalled: int = 0
    peak_in_flight: int = 0
    done_at: list[float] = field(default_factory=list)  # finish times (done or failed), s
    rejected_at: list[float] = field(default_factory=list)  # 429 arrival times
    outage_at: list[float] = field(default_factory=list)  # arrivals answered by the outage
    in_flight: list[tuple[float, int]] = field(default_factory=list)

    @property
    def waiting_s(self) -> float:
        """Worker-seconds spent in a task but with no request of it being served."""
        return max(0.0, self.worker_s - self.request_s)

    def goodput(self, capacity: float) -> float | None:
        if not self.finish_s:
            return None
        return self.completed / self.finish_s / capacity


class Bench:
    """One Redis database for broker, results, governance and counters; one run at a time."""

    def __init__(self, redis_url: str, db: int, tmp: Path, workload: Workload) -> None:
        self.url = f"{redis_url.rstrip('/')}/{db}"
        self.redis = sync_redis.Redis.from_url(self.url)
        self.tmp = tmp
        self.workload = workload
        self.client = Celery("goodput_client", broker=self.url, backend=self.url)
        self.client.conf.broker_connection_retry_on_startup = True

    def check_empty(self) -> None:
        if self.redis.dbsize():
            raise SystemExit(f"{self.url} holds keys: give an empty database with --db")

    def config(self, prefix: str, provider_url: str, declared: bool = True) -> dict[str, Any]:
        """The governed contender's configuration: the provider's documented quota (unless
        it is left to be learned), the fleet's concurrency, the others' 10 s timeout and
        a 30 s stall window; the breaker, AIMD, budgets, backoff and the rpm counting keep
        their defaults."""
        config: dict[str, Any] = {
            "store": {"redis_url": self.url, "key_prefix": prefix},
            "deferral": {"strategy": "park"},
            "sources": {
                "provider": {
                    "base_url": provider_url,
                    "model": MODEL,
                    "api_key_env": "GOODPUT_API_KEY",
                    "rpm": self.workload.rpm,
                    "max_concurrency": self.workload.workers * self.workload.threads,
                    "timeout_s": 10.0,
                }
            },
            "scopes": {
                "chat": {"kind": "chat", "sources": ["provider"], "stall_window_s": 30.0},
            },
        }
        if not declared:
            del config["sources"]["provider"]["rpm"]
        return config

    @contextlib.contextmanager
    def workers(
        self, run_id: str, contender: str, provider_url: str, declared: bool = True
    ) -> Iterator[str]:
        """Start the workers of one run; yields their queue once every one answers a ping."""
        queue = f"goodput-{run_id}"
        env = {
            **clean_env("GOODPUT_"),
            "GOODPUT_BROKER": self.url,
            "GOODPUT_PROVIDER_URL": provider_url,
            "GOODPUT_MODEL": MODEL,
            "GOODPUT_API_KEY": KEY,
            "GOODPUT_COUNTERS": f"goodput-{run_id}",
            "GOODPUT_QUEUE": queue,
        }
        if contender == "polygate":
            path = self.tmp / f"{run_id}.toml"
            path.write_text(toml(self.config(f"goodput-{run_id}", provider_url, declared)))
            env["POLYGATE_CONFIG"] = str(path)
        names = [f"{queue}-{n}@bench" for n in range(self.workload.workers)]
        processes = []
        try:
            for name in names:
                command = [sys.executable, "-m", "celery", "-A", APP, "worker", "-P", "threads"]
                command += ["-c", str(self.workload.threads), "-Q", queue, "-n", name]
                command += ["--loglevel", "WARNING", "--without-heartbeat", "--without-mingle"]
                command += ["--without-gossip"]
                processes.append(start_process(command, env, self.tmp / f"{run_id}.log"))
            self._wait_ready(names, processes)
            yield queue
        finally:
            for process in processes:
                stop_process(process, grace_s=20.0)

    def _wait_ready(self, names: list[str], processes: list[subprocess.Popen[bytes]]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in processes):
                raise RuntimeError("a worker exited at start (see its log under --keep)")
            replies = self.client.control.ping(destination=names, timeout=1.0)
            if len({name for reply in replies for name in reply}) == len(names):
                return
        raise TimeoutError("the workers did not answer a ping within 60 s")

    def counters(self, run_id: str) -> dict[str, float]:
        names = ("worker_s", "executions", "deferrals", "stalled")
        values = self.redis.mget([f"goodput-{run_id}:{n}" for n in names])
        return {n: float(v or 0) for n, v in zip(names, values, strict=True)}

    def states(self, ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The result-backend meta of each task (None while it has none)."""
        raw = self.redis.mget([f"celery-task-meta-{task_id}" for task_id in ids])
        return [json.loads(value) if value else None for value in raw]


# -- one run --------------------------------------------------------------------------------------


def run_one(bench: Bench, contender: str, scenario: str, deadline_s: float) -> Run:
    workload = bench.workload
    chosen = SCENARIOS[scenario]
    run_id = f"{contender}-{scenario}-{uuid.uuid4().hex[:6]}"
    port = embedded.free_port()
    provider_url = f"http://127.0.0.1:{port}/v1"
    run = Run(contender, scenario, workload.tasks)
    with bench.workers(run_id, contender, provider_url, chosen.declared) as queue:
        provider = SimulatedProvider(
            {MODEL: workload.behaviour(chosen)}, port=port, seed=workload.seed
        )
        with provider:
            origin = time.time()  # the provider's clock starts with it: outages are relative to it
            ids = [uuid.uuid4().hex for _ in range(workload.tasks)]
            with bench.client.producer_or_acquire() as producer:
                for i, task_id in enumerate(ids):
                    bench.client.send_task(
                        f"{APP}.{contender}", args=[i], queue=queue, task_id=task_id,
                        producer=producer,
                    )  # fmt: skip
            samples = sample_in_flight(provider, origin, lambda: finished(bench, ids), deadline_s)
            metas = bench.states(ids)
            journal = provider.journal
    counters = bench.counters(run_id)
    bench.redis.flushdb()
    for meta in metas:
        status = meta["status"] if meta else None
        if status == "SUCCESS":
            run.completed += 1
        elif status == "FAILURE":
            run.failed += 1
            kind = str((meta or {}).get("result", {}).get("exc_type", "?"))
            run.failures[kind] = run.failures.get(kind, 0) + 1
        else:
            run.lost += 1
        if status in DONE_STATES and meta and meta.get("date_done"):
            run.done_at.append(datetime.fromisoformat(meta["date_done"]).timestamp() - origin)
    run.done_at.sort()
    if not run.lost and run.done_at:
        run.finish_s = run.done_at[-1]
    run.attempts = len(journal)
    run.rate_limited = sum(1 for entry in journal if entry.outcome.startswith("429"))
    run.server_errors = sum(1 for entry in journal if entry.status >= 500)
    run.rejected_at = sorted(e.at for e in journal if e.outcome.startswith("429"))
    run.outage_at = sorted(e.at for e in journal if e.outcome == "503-outage")
    run.in_flight = samples
    run.peak_in_flight = max((n for _, n in samples), default=0)
    run.request_s = sum(SAMPLE_S * n for _, n in samples)
    run.executions = int(counters["executions"])
    run.worker_s = counters["worker_s"]
    run.deferrals = int(counters["deferrals"])
    run.stalled = int(counters["stalled"])
    return run


def finished(bench: Bench, ids: Sequence[str]) -> bool:
    return all(meta and meta["status"] in DONE_STATES for meta in bench.states(ids))


def sample_in_flight(
    provider: SimulatedProvider, origin: float, done: Any, deadline_s: float
) -> list[tuple[float, int]]:
    """Sample the provider's in-flight count every SAMPLE_S until `done()` or the deadline."""
    samples: list[tuple[float, int]] = []
    next_check = 0.0
    while True:
        now = time.time() - origin
        samples.append((now, provider.in_flight(MODEL)))
        if now >= next_check:
            if done():
                return samples
            next_check = now + 0.5
        if now > deadline_s:
            return samples
        time.sleep(max(0.0, SAMPLE_S - (time.time() - origin - now)))


# -- the report -----------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "—"
    return f"{value / reference:.2f}"


def targets(run: Run, workload: Workload, scenario: Scenario) -> list[tuple[str, bool]]:
    steady = Scenario(limiter=scenario.limiter)
    limit = 1.1 * workload.ideal_s(steady) + (workload.outage_s if scenario.outage else 0.0)
    return [
        ("0 failed", run.failed == 0),
        ("0 lost", run.lost == 0),
        (f"attempts ≤ 1.1 x tasks ({1.1 * run.tasks:.0f})", run.attempts <= 1.1 * run.tasks),
        (f"finish ≤ {limit:.1f} s", run.finish_s is not None and run.finish_s <= limit),
    ]


def report(runs: list[Run], workload: Workload, plots: dict[str, str], settings: str) -> str:
    start, end = workload.outage_window()
    bucket, window = SCENARIOS["steady"], SCENARIOS["window"]
    lines = [
        "# Goodput under a provider quota: four ways to call a model from Celery",
        "",
        "Generated by `python benchmarks/goodput.py` (`make bench`); "
        "the contenders are in `benchmarks/goodput_app.py`.",
        "",
        "## Workload (fixed before any result was seen)",
        "",
        f"- {workload.tasks} chat tasks sent at once to {workload.workers} `celery worker` "
        f"processes x {workload.threads} threads "
        f"({workload.workers * workload.threads} in flight), Redis broker and result backend.",
        f"- Simulated provider, modelled on real ones: RPM quota {workload.rpm} for the key as "
        "a token bucket refilled continuously, rate-limit headers on every answer "
        "(OpenAI's style unless the scenario says otherwise), truthful Retry-After on each "
        f"429, {workload.error_rate:.0%} of admitted requests answered 503, "
        f"{workload.latency_s * 1000:.0f} ms per answer, seed {workload.seed}.",
        f"- Scenario `outage`: the same, plus a {workload.outage_s:g} s total outage "
        f"(every request answered 503 at once) from {start:.1f} s to {end:.1f} s.",
        "- Scenarios `undeclared` and `undeclared-anthropic` (polygate_celery alone): no rpm "
        "in its configuration, the quota learned from the provider's headers. Scenario "
        "`window` (polygate_celery alone): a provider that counts its quota in 60 s windows.",
        f"- Provider capacity C = {workload.rpm} / 60 s = {workload.capacity:.1f} requests/s.",
        "- Ideal finish: failed answers are charged too, so N tasks need "
        f"A = ⌈N / (1 - p)⌉ = {workload.admitted_needed} admitted requests. A bucket of Q "
        "starts full and refills one request every 60 / Q s: T = max(0, A - Q) x 60 / Q s + L "
        f"= **{workload.ideal_s(bucket):.1f} s**; with the outage from s to e, the bucket "
        "is empty at s and refills during the outage (up to Q), so T = e + max(0, A - Q - "
        "s x Q / 60 - min(Q, (e - s) x Q / 60)) x 60 / Q s + L = "
        f"**{workload.ideal_s(SCENARIOS['outage']):.1f} s**. A 60 s window: "
        f"T = ⌊(A - 1) / Q⌋ x 60 s + L = **{workload.ideal_s(window):.1f} s**.",
        "- Goodput = completed tasks per second ÷ C.",
        "- Worker-s waiting = worker-seconds inside task executions minus request-seconds "
        "the provider spent serving (sampled every 0.1 s): time spent blocked or sleeping.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, Celery {celery.__version__}.",
        "",
        "The governed contender's configuration (every other setting at its default; the "
        "`undeclared` scenarios drop `rpm`):",
        "",
        "```toml",
        settings.strip(),
        "```",
    ]
    for scenario, chosen_scenario in SCENARIOS.items():
        chosen = [r for r in runs if r.scenario == scenario]
        if not chosen:
            continue
        ideal = workload.ideal_s(chosen_scenario)
        governed = next((r for r in chosen if r.contender == "polygate"), None)
        lines += [
            "",
            f"## Scenario `{scenario}`: {chosen_scenario.about} (ideal finish {ideal:.1f} s)",
            "",
        ]
        lines += [
            "| contender | completed | failed | lost | attempts | 429s | 503s | finish (s) "
            "| goodput | worker-s waiting | executions | deferrals | stalled verdicts |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in chosen:
            polygate = r.contender == "polygate"
            lines.append(
                f"| {CONTENDERS[r.contender]} | {r.completed} | {r.failed} | {r.lost} "
                f"| {r.attempts} | {r.rate_limited} | {r.server_errors} | {fmt(r.finish_s)} "
                f"| {fmt(r.goodput(workload.capacity), 2)} | {r.waiting_s:.0f} | {r.executions} "
                f"| {r.deferrals if polygate else '—'} | {r.stalled if polygate else '—'} |"
            )
        if governed is not None and len(chosen) > 1:
            lines += ["", "Each contender against polygate_celery (contender ÷ polygate):", ""]
            lines += [
                "| contender | attempts | 429s | finish | goodput | worker-s waiting |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for r in chosen:
                if r is governed:
                    continue
                lines.append(
                    f"| {CONTENDERS[r.contender]} | {ratio(r.attempts, governed.attempts)} "
                    f"| {ratio(r.rate_limited, governed.rate_limited)} "
                    f"| {ratio(r.finish_s, governed.finish_s)} "
                    f"| {ratio(r.goodput(workload.capacity), governed.goodput(workload.capacity))} "
                    f"| {ratio(r.waiting_s, governed.waiting_s)} |"
                )
        if governed is not None and chosen_scenario.outage:
            start, _ = workload.outage_window()
            at = ", ".join(f"{t - start:.1f}" for t in governed.outage_at)
            lines += ["", (
                f"polygate_celery's requests during the outage: {len(governed.outage_at)}, "
                f"at {at or '—'} s into it; the other attempts past the tasks are the "
                f"{governed.server_errors - len(governed.outage_at)} drawn 503s."
            )]  # fmt: skip
        if governed is not None:
            lines += ["", "Targets for polygate_celery:", ""]
            for name, met in targets(governed, workload, chosen_scenario):
                lines.append(f"- {name}: **{'PASS' if met else 'MISSED'}**")
        failures = [(r, r.failures) for r in chosen if r.failures]
        if failures:
            lines += ["", "Failures by exception: " + "; ".join(
                f"{CONTENDERS[r.contender]}: " + ", ".join(f"{k} x {v}" for k, v in f.items())
                for r, f in failures
            ) + "."]  # fmt: skip
        if scenario in plots:
            lines += ["", f"![{scenario}]({plots[scenario]})"]
    return "\n".join(lines) + "\n"


def plot(runs: list[Run], workload: Workload, scenario: str, path: Path) -> bool:
    """Completed tasks, 429s per second and in-flight requests over time, one column each."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        log("matplotlib is not installed (pip install '.[bench]'): no plots")
        return False
    chosen = [r for r in runs if r.scenario == scenario]
    if not chosen:
        return False
    outage = SCENARIOS[scenario].outage
    ideal = workload.ideal_s(SCENARIOS[scenario])
    end = max([ideal] + [r.in_flight[-1][0] for r in chosen if r.in_flight])
    figure, axes = plt.subplots(
        3, len(chosen), figsize=(4 * len(chosen), 8), sharex=True, sharey="row", squeeze=False
    )
    for column, run in enumerate(chosen):
        top, middle, bottom = axes[0][column], axes[1][column], axes[2][column]
        top.set_title(CONTENDERS[run.contender], fontsize=10)
        times = [0.0, *run.done_at]
        top.step(times, range(len(times)), where="post", color="tab:blue")
        top.axhline(workload.tasks, color="grey", linewidth=0.5)
        top.axvline(ideal, color="tab:green", linestyle="--", linewidth=0.8)
        seconds = int(end) + 1
        per_second = [0] * seconds
        for at in run.rejected_at:
            per_second[min(int(at), seconds - 1)] += 1
        middle.bar(range(seconds), per_second, width=1.0, color="tab:red")
        bottom.plot(
            [t for t, _ in run.in_flight], [n for _, n in run.in_flight], color="tab:purple"
        )
        for axis in (top, middle, bottom):
            if outage:
                axis.axvspan(*workload.outage_window(), color="grey", alpha=0.15)
            axis.set_xlim(0, end)
        bottom.set_xlabel("seconds")
    axes[0][0].set_ylabel("tasks finished (done or failed)")
    axes[1][0].set_ylabel("429s per second")
    axes[2][0].set_ylabel("requests in flight")
    figure.suptitle(
        f"{workload.tasks} tasks, quota {workload.rpm} RPM, {scenario}"
        + (" (grey: outage; dashed: ideal finish)" if outage else " (dashed: ideal finish)"),
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


# -- main -----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    defaults = Workload()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=11)
    parser.add_argument(
        "--contenders", nargs="+", choices=list(CONTENDERS), default=list(CONTENDERS)
    )
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument("--plots", type=Path, default=ROOT / "benchmarks" / "results")
    for name in ("tasks", "workers", "threads", "rpm", "seed"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    for name in ("error_rate", "latency_s", "outage_s"):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=float, default=getattr(defaults, name))
    args = parser.parse_args(argv)
    workload = Workload(
        tasks=args.tasks, workers=args.workers, threads=args.threads, rpm=args.rpm,
        error_rate=args.error_rate, latency_s=args.latency_s, outage_s=args.outage_s,
        seed=args.seed,
    )  # fmt: skip
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="goodput-") as tmp:
        bench = Bench(args.redis, args.db, Path(tmp), workload)
        bench.check_empty()
        try:
            for scenario in args.scenarios:
                deadline = 3 * workload.ideal_s(SCENARIOS[scenario]) + 60
                contenders = args.contenders if SCENARIOS[scenario].everyone else ["polygate"]
                for contender in contenders:
                    log(f"{scenario}: {contender} …")
                    run = run_one(bench, contender, scenario, deadline)
                    log(
                        f"{scenario}: {contender}: {run.completed} completed, {run.failed} failed, "
                        f"{run.lost} lost, {run.attempts} attempts, {run.rate_limited} 429s, "
                        f"finish {fmt(run.finish_s)} s"
                    )
                    runs.append(run)
        finally:
            bench.redis.flushdb()
    args.plots.mkdir(parents=True, exist_ok=True)
    plots = {}
    for scenario in args.scenarios:
        path = args.plots / f"goodput-{scenario}.png"
        if plot(runs, workload, scenario, path):
            plots[scenario] = os.path.relpath(path, args.out.parent)
    shown = Bench.config(bench, "goodput", "http://provider/v1")
    del shown["store"]
    text = report(runs, workload, plots, toml(shown))
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
