"""Edge: the demonstration behind `polygate-celery demo`, governed calls on the in-memory store.

A simulated fleet workload in virtual time: a chat scope whose primary source
has an outage and less capacity than its configured cap (so it answers 429 until
the adaptive limit settles), falling back to a quota-limited hosted source; and
an embedding scope with occasional server errors. Then one call of each kind
(chat, embedding) to a provider that queues instead of refusing: it holds every
request for the full timeout and then answers 429, and the demo shows when and
how each call gives up. Minutes of simulated traffic run in well under a second
and end with a summary of every call.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, TextIO

from polygate_celery.config.loading import parse_config
from polygate_celery.core.outcome import Outcome
from polygate_celery.errors import AllSourcesExhausted, SourceFatalError
from polygate_celery.governance.gateway import Gateway
from polygate_celery.store.memory import MemoryStore
from polygate_celery.telemetry import AttemptEvent, Event
from polygate_celery.testing import ScriptedSource, VirtualClock, steps

CONFIG: dict[str, Any] = {
    "sources": {
        "vllm": {"timeout_s": 30, "max_concurrency": 8, "model": "qwen2.5-7b-instruct"},
        "hosted": {"timeout_s": 30, "max_concurrency": 4, "rpm": 90, "model": "gpt-4o-mini"},
        "embedder": {"timeout_s": 10, "max_concurrency": 6, "rpm": 600, "model": "bge-m3"},
        "ocr-gpu": {"timeout_s": 20, "max_concurrency": 2, "model": "qwen2.5-vl-7b"},
    },
    "scopes": {
        "summarise": {"kind": "chat", "sources": ["vllm", "hosted"], "stall_window_s": 120},
        "embed": {"kind": "embedding", "sources": ["embedder"], "stall_window_s": 120},
        "ocr": {"kind": "ocr", "sources": ["ocr-gpu"], "stall_window_s": 120},
    },
}
OUTAGE = (120.0, 240.0)
OCR_OUTAGE = (100.0, 280.0)
# Arrivals per simulated second, per scope.
ARRIVALS = {"summarise": 2, "embed": 2, "ocr": 0.5}
SCOPES = tuple(ARRIVALS)


@dataclass
class SimulatedEndpoint:
    """An endpoint with real capacity, latency, error rate and an optional outage window."""

    clock: VirtualClock
    rng: random.Random
    capacity: int
    latency_s: tuple[float, float]
    error_rate: float = 0.0
    outage: tuple[float, float] | None = None
    in_flight: int = 0

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        now = self.clock.now()
        if self.outage and self.outage[0] <= now < self.outage[1]:
            await self.clock.sleep(min(timeout_s, 0.2))
            return Outcome.transient("service unavailable", status=503)
        if self.in_flight >= self.capacity:
            await self.clock.sleep(0.05)
            return Outcome.rate_limited(2.0)
        self.in_flight += 1
        try:
            latency = self.rng.uniform(*self.latency_s)
            await self.clock.sleep(min(latency, timeout_s))
        finally:
            self.in_flight -= 1
        if latency > timeout_s:
            return Outcome.timeout()
        if self.rng.random() < self.error_rate:
            return Outcome.transient("internal server error", status=500)
        return Outcome.success(f"result for {payload}", prompt_tokens=400, completion_tokens=80)


class Tally:
    """Counts attempts per source and outcome from telemetry."""

    def __init__(self) -> None:
        self.attempts: dict[str, Counter[str]] = defaultdict(Counter)

    def __call__(self, event: Event) -> None:
        if isinstance(event, AttemptEvent):
            self.attempts[event.record.source][event.record.outcome] += 1


@dataclass
class Workload:
    """What the simulated fleet did: every call's verdict and duration, by scope."""

    gateway: Gateway
    tally: Tally
    verdicts: dict[str, list[tuple[str, float]]]
    total: int
    ended_s: float = 0.0


async def _call(work: Workload, scope: str, payload: str) -> None:
    clock = work.gateway.clock
    started = clock.now()
    try:
        await work.gateway.call(scope, payload)
        verdict = "success"
    except AllSourcesExhausted as exc:
        verdict = exc.reason  # under Celery: stalled/deadline defer, retry_exhausted fails
    except SourceFatalError:
        verdict = "fatal"
    work.verdicts[scope].append((verdict, clock.now() - started))
    work.ended_s = max(work.ended_s, clock.now())


def _build(clock: VirtualClock, rng: random.Random) -> Workload:
    sources = {
        "vllm": SimulatedEndpoint(clock, rng, capacity=5, latency_s=(2, 6), outage=OUTAGE),
        "hosted": SimulatedEndpoint(clock, rng, capacity=16, latency_s=(1, 3)),
        "embedder": SimulatedEndpoint(clock, rng, 12, (0.2, 1), error_rate=0.03),
        "ocr-gpu": SimulatedEndpoint(clock, rng, 2, (1, 3), outage=OCR_OUTAGE),
    }
    tally = Tally()
    gateway = Gateway(
        parse_config(CONFIG),
        sources,
        store=MemoryStore(clock),
        clock=clock,
        random=rng.random,
        hooks=[tally],
        caller="task",  # the fleet it simulates runs governed tasks, which park
    )
    return Workload(gateway, tally, defaultdict(list), total=0)


async def _fleet(out: TextIO, seconds: int) -> Workload:
    """Calls arrive for `seconds` simulated seconds; progress every simulated minute."""
    clock = VirtualClock()
    work = _build(clock, random.Random(7))
    work.total = sum(int(rate * seconds) for rate in ARRIVALS.values())
    tasks: list[asyncio.Task[None]] = []
    for tick in range(2 * seconds):  # half-second ticks
        for scope, rate in ARRIVALS.items():
            due = int(rate * (tick + 1) / 2) - int(rate * tick / 2)
            tasks.extend(
                asyncio.ensure_future(_call(work, scope, f"{scope} item {tick}-{n}"))
                for n in range(due)
            )
        await clock.sleep(0.5)
        if tick % 120 == 119:
            await _progress(out, work)
    everything = asyncio.gather(*tasks)
    while not everything.done():
        minute = asyncio.ensure_future(clock.sleep(60))
        either: set[asyncio.Future[Any]] = {everything, minute}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        minute.cancel()
        await _progress(out, work)
    await everything
    return work


async def _progress(out: TextIO, work: Workload) -> None:
    done = sum(len(v) for v in work.verdicts.values())
    parts = []
    for scope in SCOPES:
        for snap in await work.gateway.snapshot(scope):
            parts.append(f"{snap.name} {snap.permits_in_use}/{snap.permit_limit} {snap.breaker}")
    now = work.gateway.clock.now()
    print(f"  t={now:4.0f}s  done {done:4d}/{work.total}  " + "  ".join(parts), file=out)


async def _queueing_provider(kind: str) -> tuple[str, int, float]:
    clock = VirtualClock()
    source = ScriptedSource.always(clock, steps.rate_limited(duration_s=300))
    config = parse_config(
        {
            "sources": {"gw": {"timeout_s": 300}},
            "scopes": {"s": {"kind": kind, "sources": ["gw"], "stall_window_s": 300}},
        }
    )
    gw = Gateway(config, {"gw": source}, clock=clock, random=lambda: 0.0)
    try:
        await gw.call("s", "prompt")
    except AllSourcesExhausted as exc:
        return exc.reason, source.attempts, clock.now()
    return "success", source.attempts, clock.now()


def _table(out: TextIO, columns: list[str], rows: list[list[Any]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows, strict=True)]
    for cells in [columns, *rows]:
        line = "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        print("  " + line, file=out)


VERDICTS = ["success", "stalled", "retry_exhausted", "deadline", "fatal"]
MEANING = {
    "success": "answered",
    "stalled": "no progress for the stall window; under Celery the task is deferred",
    "retry_exhausted": "its retries used up; under Celery the task fails",
    "deadline": "out of time; under Celery the task is deferred",
    "fatal": "a request that cannot succeed; under Celery the task fails",
}


async def run_demo(out: TextIO = sys.stdout, seconds: int = 300) -> int:
    """Run the demonstration; returns the number of calls not accounted for (0)."""
    print(
        "polygate_celery demo: governed calls on the in-memory store, in virtual time\n", file=out
    )
    print(
        "Three scopes (kinds of work) call their sources (model endpoints) in order. Per "
        "scope: its calls a\nsecond; per source: its cap (calls at once it is allowed) and "
        "what it really does.",
        file=out,
    )
    print(
        f"  summarise (chat, {ARRIVALS['summarise']}/s): vllm (cap 8, serves 5 at once, "
        f"down {OUTAGE[0]:.0f}-{OUTAGE[1]:.0f} s) then hosted (cap 4, 90 a minute)",
        file=out,
    )
    print(
        f"  embed (embedding, {ARRIVALS['embed']}/s): embedder (cap 6, 3% server errors)", file=out
    )
    print(
        f"  ocr (ocr, {ARRIVALS['ocr']}/s): ocr-gpu (cap 2, "
        f"down {OCR_OUTAGE[0]:.0f}-{OCR_OUTAGE[1]:.0f} s)\n",
        file=out,
    )
    print(
        "Every simulated minute: calls done, and per source its calls in flight / its "
        "current limit (adaptive,\nat most the cap) and its breaker (closed: calls go "
        "through; open: refused while it is down).",
        file=out,
    )
    real_start = time.perf_counter()
    work = await _fleet(out, seconds)
    real = time.perf_counter() - real_start

    print(f"\nCalls ({work.ended_s:.0f} simulated seconds in {real:.2f} s real)", file=out)
    rows: list[list[Any]] = []
    for scope in SCOPES:
        results = work.verdicts[scope]
        counts = Counter(v for v, _ in results)
        latencies = sorted(d for _, d in results)
        p95 = latencies[int(0.95 * (len(latencies) - 1))]
        rows.append(
            [
                scope,
                len(results),
                *(counts[v] for v in VERDICTS),
                f"{statistics.median(latencies):.1f}",
                f"{p95:.1f}",
            ]
        )
    _table(out, ["scope", "calls", *VERDICTS, "p50 s", "p95 s"], rows)
    accounted = sum(len(v) for v in work.verdicts.values())

    print("\nAttempts by source (permit limit: the adaptive limit at the end)", file=out)
    rows = []
    for scope in SCOPES:
        for snap in await work.gateway.snapshot(scope):
            seen = work.tally.attempts[snap.name]
            rows.append(
                [
                    snap.name,
                    seen["success"],
                    seen["rate_limited"],
                    seen["transient"],
                    f"{snap.permit_limit}",
                    snap.breaker,
                ]
            )
    _table(out, ["source", "success", "429", "transient", "permit limit", "breaker"], rows)

    print(
        "\nOne call to a provider that queues instead of refusing (it holds every request "
        "300 s, then\nanswers 429; timeout_s = stall_window_s = 300). How each kind of call "
        "ends:",
        file=out,
    )
    for kind in ("chat", "embedding"):
        verdict, attempts, elapsed = await _queueing_provider(kind)
        print(
            f"  {kind:10s} {verdict} after {attempts} attempt(s), {elapsed:.0f} s: "
            f"{MEANING[verdict]}",
            file=out,
        )

    missing = work.total - accounted
    print(
        f"\n{accounted} of {work.total} calls accounted for." + (" " if missing else ""), file=out
    )
    print(
        "Under Celery, stalled and deadline verdicts become deferred re-enqueues; "
        "retry_exhausted and fatal fail the task.",
        file=out,
    )
    print(
        "Next: README.md (outcomes, configuration); polygate-celery example env (every setting).",
        file=out,
    )
    return missing
