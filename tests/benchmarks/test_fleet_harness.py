"""The fleet benchmarks run end to end at a tiny size, so `make soak` never finds them rotten."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_fleet_scale_run_reports_every_call_and_no_refusal() -> None:
    report = run("fleet.py", "--processes", "2", "--callers", "5")
    assert "| verdicts | {'success': 10} |" in report
    assert "| provider refusals (429 for capacity or rate) | 0 |" in report


def test_the_wake_up_table_has_a_row_per_process_count() -> None:
    report = run("fleet_wakeups.py", "--processes", "1,2", "--callers", "4", "--acquisitions", "40")
    rows = [
        line
        for line in report.splitlines()
        if line.startswith("| 1 x 4 ") or line.startswith("| 2 x 2 ")
    ]
    assert len(rows) == 2, report


def test_the_quota_fairness_row_reports_waits_and_no_refusal() -> None:
    report = run("quota_fairness.py", "--processes", "2", "--callers", "2", "--calls", "12")
    (row,) = [line for line in report.splitlines() if line.startswith("| this commit ")]
    assert "| {'success': 12} |" in row
    assert "FAILED" not in report


def test_the_side_by_side_table_has_the_package_beside_a_fifo_limiter() -> None:
    report = run(
        "quota_fairness.py", "--side-by-side", "--errors", "0.1",
        "--processes", "2", "--callers", "2", "--calls", "12",
    )  # fmt: skip
    rows = [line for line in report.splitlines() if line.startswith("| polygate_celery")]
    assert len(rows) == 3, report
    assert any(line.startswith("| FIFO limiter") for line in report.splitlines()), report
    assert all("| 12 / 12 |" in row for row in rows), report
    assert "FAILED" not in report


def test_the_celery_priorities_table_has_a_row_per_broker_governance_and_phase() -> None:
    report = run(
        "celery_priorities.py", "--brokers", "redis",
        "--batch", "100", "--warmup-s", "3", "--share", "0.05",
    )  # fmt: skip
    rows = [line for line in report.splitlines() if line.startswith("| redis |")]
    assert len(rows) == 4, report  # (FIFO, classes) x (half, above the quota)
    assert "FAILED" not in report


def test_the_fair_share_table_has_a_row_per_window_and_no_refusal() -> None:
    # (too short for its targets: the tenants' shares are asserted on virtual time, by
    # the store contract; here the benchmark runs end to end)
    done = subprocess.run(
        [sys.executable, "benchmarks/fair_share.py", "--processes", "2", "--callers", "1",
         "--warmup-s", "5", "--window-s", "10", "--windows", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    report = done.stdout
    assert any(line.startswith("| 0-10 s |") for line in report.splitlines()), done.stderr[-3000:]
    assert "provider 429s 0;" in report, report
    assert "'success'" in report, report


def test_the_tenant_caps_table_counts_each_cap_at_the_provider() -> None:
    # (too short for the rate targets, which follow the buckets' first minute: the caps
    # are asserted exactly by the store contract and the Redis outage test)
    done = subprocess.run(
        [sys.executable, "benchmarks/tenant_caps.py", "--processes", "2", "--callers", "2",
         "--seconds", "12"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    report = done.stdout
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if "|" in line}
    assert set("abcd") <= set(rows), done.stderr[-3000:]
    peak = int(rows["a"].split("most in flight")[1].split("|")[0])
    assert 1 <= peak <= 3, rows["a"]
    assert "never over" in rows["b"], rows["b"]
    assert "provider 429s 0;" in report, report
