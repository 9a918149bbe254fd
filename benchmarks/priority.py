"""Priority classes on a shared quota: how long interactive calls wait behind a batch backlog.

Run: ``.venv/bin/python benchmarks/priority.py [--processes 4] [--batch-callers 16]
[--warmup-s 45] [--label NAME] [--plot PATH]`` (a private ``redis-server``; the
simulator in this process). Prints a Markdown report, and with ``--plot`` each class's
grants over time; `benchmarks/results/priority.md` (and `priority.png`) hold the
committed run.

One simulated source, ``max_concurrency = 8`` and ``rpm = 600`` (a bucket, the
default window), answers in 0.2-0.4 s; the provider counts 600 RPM as a token bucket.
Two classes are declared, ``interactive`` and ``batch`` (the default, ``min_share =
0.1``); everything else is the package's defaults. `processes` worker processes each
keep `batch_callers` batch calls in flight, one after another, from the go to the end:
a backlog that saturates the quota once the bucket's first burst is spent (the warm-up).
Then interactive calls arrive, spread evenly over the fleet: 100 over 20 s (half the
quota), then 300 over 20 s (one and a half times the quota). Per phase: each class's
wait for a permit (a call's first ask of the store to its grant), the grants of each
class, the provider's requests against its quota, and its refusals (429), which must be
none. The targets (issue 38): interactive p99 wait in the first phase at most one answer
time plus 0.5 s (0.9 s); batch at least its floor (10 %) of the grants in the second,
to one grant;
the provider's use at least 95 % of its quota in both.
"""

from __future__ import annotations

import argparse
import asyncio
import math
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
    plot_axes,
    ready_then_wait,
    report_on_a_private_redis,
    run_fleet,
    save_plot,
)

CAP, RPM = 8, 600
LATENCY_S = (0.2, 0.4)
PHASES = (("half the quota", 100, 20.0), ("above the quota", 300, 20.0))
FLOOR = 0.1
P99_TARGET_S = LATENCY_S[1] + 0.5


def config(base_url: str) -> dict[str, Any]:
    base = chat_config(base_url, "prio-model", CAP, RPM)
    priorities = {"interactive": {}, "batch": {"default": True, "min_share": FLOOR}}
    return {**base, "priorities": priorities}


async def worker(spec: dict[str, Any]) -> dict[str, Any]:
    from polygate_celery import AllSourcesExhausted, Gateway, parse_config  # noqa: PLC0415
    from polygate_celery.store.redis import RedisStore  # noqa: PLC0415

    store = RedisStore.from_url(spec["url"], prefix=spec["prefix"], socket_timeout_s=30)
    grants: list[tuple[float, str, float]] = []  # (granted at, class, wait), wall clock

    def granted(request: Any, grant: Any, wait_s: float) -> None:
        rank = request.standing.rank
        grants.append((time.time(), "interactive" if rank == 0 else "batch", wait_s))

    counts = count_waits(store, granted, time.time)
    gateway = Gateway(parse_config(config(spec["base_url"])), store=store)
    await ready_then_wait(spec)
    began = time.time()
    end = began + spec["warmup_s"] + sum(seconds for _, _, seconds in PHASES)
    verdicts: Counter[str] = Counter()
    messages = [{"role": "user", "content": "summarise"}]

    async def call(priority: str) -> None:
        try:
            await gateway.chat("summarise", messages, priority=priority)
            verdicts[f"{priority} success"] += 1
        except AllSourcesExhausted as exc:
            verdicts[f"{priority} {exc.reason}"] += 1

    async def batch() -> None:
        while time.time() < end:
            await call("batch")

    async def interactive() -> None:
        at = began + spec["warmup_s"]
        calls = []
        for _, n, seconds in PHASES:
            mine = n // spec["processes"]
            for k in range(mine):  # evenly over the phase, the processes interleaved
                due = at + (k + spec["index"] / spec["processes"]) * seconds / mine
                await asyncio.sleep(max(0.0, due - time.time()))
                calls.append(asyncio.ensure_future(call("interactive")))
            at += seconds
        await asyncio.gather(*calls)

    batches = [asyncio.ensure_future(batch()) for _ in range(spec["batch_callers"])]
    await interactive()
    await asyncio.gather(*batches)
    await gateway.aclose()
    return {**counts, "grants": grants, "verdicts": dict(verdicts), "began": began}


def by_window(grants: list[tuple[float, str, float]], start: float, seconds: float) -> str:
    """Batch's grants of all, in each 5 s of a phase."""
    parts = []
    for k in range(int(seconds // 5)):
        inside = [c for t, c, _ in grants if start + 5 * k <= t < start + 5 * (k + 1)]
        parts.append(f"{inside.count('batch')}/{len(inside)}")
    return ", ".join(parts)


def pct(values: list[float], q: float) -> float:
    """The `q` quantile (nearest rank): of 100 waits, p99 is the 99th."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else float("nan")


BIN_S = 2.0  # the plot's bins


def plot(grants: list[tuple[float, str, float]], began: float, warmup_s: float, path: Path) -> bool:
    """Each class's grants per second (`BIN_S` bins) over the run, the phases marked."""
    made = plot_axes(
        f"grants per second ({BIN_S:g} s bins)",
        f"Two classes on one {RPM} RPM quota (grey: the quota, dotted: batch's floor; dashed: "
        "the phases)",
    )
    if made is None:
        return False
    figure, axis = made
    bins = int((max(at for at, _, _ in grants) - began) // BIN_S) + 1
    for klass in ("interactive", "batch"):
        per_bin = [0] * bins
        for at, who, _ in grants:
            if who == klass:
                per_bin[int((at - began) // BIN_S)] += 1
        axis.step([BIN_S * k for k in range(bins)], [n / BIN_S for n in per_bin], where="post",
                  label=klass)  # fmt: skip
    axis.axhline(RPM / 60.0, color="grey", linewidth=0.5)  # the quota
    axis.axhline(RPM / 60.0 * FLOOR, color="grey", linewidth=0.5, linestyle=":")  # batch's floor
    mark = warmup_s
    for _, _, seconds in PHASES:
        axis.axvline(mark, color="grey", linestyle="--", linewidth=0.8)
        mark += seconds
    axis.axvline(mark, color="grey", linestyle="--", linewidth=0.8)
    axis.set_ylim(0, RPM / 60.0 * 1.5)  # (the bucket's first burst, at the start, is cut off)
    save_plot(figure, axis, path)
    return True


async def run(
    url: str,
    processes: int,
    batch_callers: int,
    warmup_s: float,
    label: str,
    plot_path: str | None = None,
) -> str:
    run_id = uuid.uuid4().hex[:8]
    with bucket_provider("prio-model", CAP, RPM, LATENCY_S) as provider:
        specs = {
            "base_url": provider.url,
            "prefix": f"prio-{run_id}",
            "batch_callers": batch_callers,
            "warmup_s": warmup_s,
            "processes": processes,
        }
        fleet = await run_fleet(__file__, url, specs, processes)
        journal = provider.journal
        epoch = time.time() - provider.since_start()  # the journal's clock, as epoch seconds
    results = fleet.results
    began = min(r["began"] for r in results)
    grants = sorted(g for r in results for g in r["grants"])
    verdicts = sum((Counter(r["verdicts"]) for r in results), Counter())
    refused = sum(r["admits"] - r["granted"] for r in results)
    requests = sorted(e.at + epoch for e in journal)
    refusals = sum(1 for e in journal if e.outcome.startswith("429"))
    lines = [
        f"# Priority classes on a shared quota ({label})",
        "",
        f"{processes} worker processes x {batch_callers} batch calls in flight; source cap "
        f"{CAP}, {RPM} RPM (a bucket at the provider too), answers in {LATENCY_S[0]}-"
        f"{LATENCY_S[1]} s; classes interactive > batch (min_share {FLOOR}); warm-up "
        f"{warmup_s:.0f} s (the bucket's first burst spent), then each phase's interactive "
        f"calls spread evenly. Python {sys.version.split()[0]}, a private redis-server.",
        "",
        "| phase | interactive calls | interactive wait p50 / p99 / slowest | batch wait "
        "p50 / p99 | grants: interactive / batch (batch share) | provider requests / "
        "quota | provider 429s |",
        "|---|---|---|---|---|---|---|",
    ]
    at = began + warmup_s
    failed: list[str] = []
    windows: list[str] = []
    for name, n, seconds in PHASES:
        inside = [g for g in grants if at <= g[0] < at + seconds]
        waits = {c: [w for _, k, w in inside if k == c] for c in ("interactive", "batch")}
        counts = Counter(k for _, k, _ in inside)
        share = counts["batch"] / max(1, len(inside))
        served = sum(1 for t in requests if at <= t < at + seconds)
        quota = RPM / 60.0 * seconds
        late = sum(
            1 for e in journal if e.outcome.startswith("429") and at <= e.at + epoch < at + seconds
        )
        i_w, b_w = waits["interactive"], waits["batch"]
        lines.append(
            f"| {name} | {n} | {pct(i_w, 0.5):.2f} / {pct(i_w, 0.99):.2f} / "
            f"{max(i_w, default=float('nan')):.2f} s | {pct(b_w, 0.5):.2f} / "
            f"{pct(b_w, 0.99):.2f} s | {counts['interactive']} / {counts['batch']} "
            f"({100 * share:.0f} %) | {served} / {quota:.0f} ({100 * served / quota:.0f} %) "
            f"| {late} |"
        )
        if name == PHASES[0][0] and pct(i_w, 0.99) > P99_TARGET_S:
            failed.append(f"interactive p99 {pct(i_w, 0.99):.2f} s > {P99_TARGET_S} s")
        # A floor is kept to one grant: 10 % of 200 grants is 20, and batch's first owed
        # grant comes after nine of interactive's (core.standing.used_credits).
        if name == PHASES[1][0] and counts["batch"] < FLOOR * len(inside) - 1:
            failed.append(f"batch {counts['batch']} of {len(inside)} grants < its floor {FLOOR}")
        if name == PHASES[1][0]:
            windows.append(by_window(inside, at, seconds))
        if served < 0.95 * quota:
            failed.append(f"{name}: provider use {served / quota:.0%} < 95 %")
        at += seconds
    lines += [
        "",
        f"Batch grants of all grants above the quota, by 5 s: {windows[0]}.",
        "",
        f"Verdicts: {dict(sorted(verdicts.items()))}; refused admissions per acquisition "
        f"{refused / max(1, len(grants)):.2f}; provider 429s in the whole run {refusals}; "
        f"Redis commands per acquisition {fleet.total_commands / max(1, len(grants)):.1f}, "
        f"Redis CPU per acquisition {1000 * fleet.redis_cpu_s / max(1, len(grants)):.2f} ms.",
    ]
    if refusals:
        failed.append(f"{refusals} provider refusals")
    if plot_path and plot(grants, began, warmup_s, Path(plot_path)):
        lines += ["", f"![grants per class]({Path(plot_path).name})"]
    if failed:
        lines += ["", "**FAILED**: " + "; ".join(failed)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--batch-callers", type=int, default=16)
    parser.add_argument("--warmup-s", type=float, default=45.0)
    parser.add_argument("--plot", help="write the plot here (PNG)")
    args = fleet_args(parser, worker)
    if args is None:
        return
    report_on_a_private_redis(
        lambda url: run(
            url, args.processes, args.batch_callers, args.warmup_s, args.label, args.plot
        ),
        "a target missed (see the report)",
    )


if __name__ == "__main__":
    main()
