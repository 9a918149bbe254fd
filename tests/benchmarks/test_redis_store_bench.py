"""The Redis store benchmark runs end to end at a tiny size, so its committed figures can be
made again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import own_redis

ROOT = Path(__file__).resolve().parents[2]


def test_the_overhead_report_has_two_round_trips_and_a_ratio() -> None:
    # A server of its own: the report counts every command the server ran (INFO
    # commandstats), and a shared one also runs other tests' commands meanwhile.
    with own_redis() as url:
        done = subprocess.run(
            [sys.executable, "benchmarks/redis_store.py", "--redis", url, "--calls", "100"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| **total round trips** | **2.00** |" in done.stdout
    assert "Redis-store overhead / PING (medians): **" in done.stdout
    assert "| with the quota | admit |" in done.stdout
