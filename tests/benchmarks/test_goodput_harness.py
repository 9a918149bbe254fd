"""The goodput benchmark's harness runs end to end, so `make bench` never rots.

A tiny workload on a private Redis: every contender on real workers and the
simulated provider, one scenario, the report and its plot written.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import goodput
from tests.redis_server import RedisServer


def test_every_contender_runs_and_every_task_is_accounted_for(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    with RedisServer() as server:
        base = server.url.rsplit("/", 1)[0]
        options = {"--tasks": 4, "--workers": 1, "--threads": 2, "--rpm": 600}
        options |= {"--latency-s": 0.05, "--error-rate": 0.1, "--outage-s": 1.5}
        argv = ["--redis", base, "--db", "0", "--scenarios", "outage"]
        argv += ["--out", str(out), "--plots", str(tmp_path)]
        argv += [str(part) for pair in options.items() for part in pair]
        code = goodput.main(argv)
    assert code == 0
    report = out.read_text(encoding="utf-8")
    rows = [line for line in report.splitlines() if line.startswith("| ") and "|---" not in line]
    for label in goodput.CONTENDERS.values():
        (row,) = [r for r in rows if r.startswith(f"| {label} | ") and r.count("|") > 10]
        completed, failed, lost = (int(cell) for cell in row.split("|")[2:5])
        assert completed + failed + lost == 4
    (governed,) = [r for r in rows if r.startswith("| polygate_celery | ") and r.count("|") > 10]
    assert [cell.strip() for cell in governed.split("|")[2:5]] == ["4", "0", "0"]
    assert "Targets for polygate_celery" in report
    assert (tmp_path / "goodput-outage.png").stat().st_size > 10_000
    assert "![outage](goodput-outage.png)" in report
