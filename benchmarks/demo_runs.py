"""The demo shows what it claims on any machine: `polygate-celery demo`, several times, idle
and beside two CPU-bound processes.

Run: ``.venv/bin/python benchmarks/demo_runs.py [--runs 3]``. Each run is the demo with
its defaults (40 documents of 5 pages, an embedded Redis) through `run_pipeline`. The
busy runs start two processes that spin on the CPU (this machine has two cores) for the
whole run. Prints a Markdown table and checks every run against the targets: at least
one 429 handled, at least one deferral whose task ran again, nothing lost. The first
idle run's timeline is drawn to ``examples/pipeline/demo-timeline.png`` (``--plot``).
`benchmarks/results/demo_runs.md` is the committed run; exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

from polygate_celery.demo.pipeline import Report, run_pipeline

ROOT = Path(__file__).resolve().parents[1]


def spin() -> None:  # pragma: no cover - a busy process, killed at the end
    while True:
        pass


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(processes)]
    for process in spinners:
        process.start()
    try:
        yield
    finally:
        for process in spinners:
            process.kill()
            process.join()


def misses(report: Report) -> list[str]:
    found = []
    if report.limited < 1:
        found.append("no 429")
    if report.deferred_tasks < 1:
        found.append("no deferral")
    if report.lost:
        found.append(f"{report.lost} lost")
    return found


def row(n: int, load: str, report: Report) -> str:
    recovery = f"{report.recovery_s:.1f} s" if report.recovery_s is not None else "-"
    verdict = ", ".join(misses(report)) or "PASS"
    return (
        f"| {n} | {load} | {report.tasks} | {report.succeeded} | {report.failed} | {report.lost} "
        f"| {report.limited} | {report.down} | {report.deferred_tasks} / {report.deferrals} "
        f"| {recovery} | {report.elapsed_s:.0f} s | {verdict} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per load (default 3)")
    parser.add_argument("--plot", type=Path, default=ROOT / "examples/pipeline/demo-timeline.png")
    args = parser.parse_args()
    os.environ.pop("POLYGATE_REDIS_URL", None)  # the embedded server, as on a fresh machine
    lines = [
        "# The demo, run after run",
        "",
        f"`python benchmarks/demo_runs.py --runs {args.runs}` on {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), Python {platform.python_version()}; "
        "the demo's defaults (40 documents of 5 pages: 440 tasks). Busy: two processes spinning "
        "on the CPU beside it. Targets per run: at least one 429 handled, at least one deferred "
        "task that ran again, 0 lost.",
        "",
        "| run | load | tasks | succeeded | failed | lost | 429s | 503s | deferred tasks / "
        "deferrals | first summary after the outage | duration | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    failed = False
    n = 0
    for load in ("idle", "busy"):
        for i in range(args.runs):
            n += 1
            plot = args.plot if (load, i) == ("idle", 0) else None
            with busy(2) if load == "busy" else contextlib.nullcontext():
                report = run_pipeline(out=io.StringIO(), plot=plot)
            lines.append(row(n, load, report))
            failed = failed or bool(misses(report))
            print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"Timeline of run 1: `{args.plot.relative_to(ROOT)}`."]
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
