"""The main job: the demo runs the example pipeline end to end on an embedded Redis."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from polygate_celery.cli import main
from polygate_celery.demo.pipeline import DemoError, run


def test_the_demo_accounts_for_every_task_on_an_embedded_redis(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("POLYGATE_REDIS_URL", raising=False)  # as on a machine without Redis
    out = io.StringIO()
    environment = dict(os.environ)
    plot = tmp_path / "timeline.png"
    assert run(documents=6, pages=2, out=out, outage=(0.0, 7.0), timeout_s=120, plot=plot) == 0
    assert dict(os.environ) == environment  # the workers' settings stay theirs
    text = out.getvalue()
    assert "an embedded server" in text
    assert "30 of 30 tasks accounted for: 30 succeeded; " in text  # 12 + 12 + 6 summaries
    assert "none lost." in text
    summary = text.split("Done in", 1)[1]
    assert "summarise      6          6       0" in summary
    # The outage met the summaries whatever the machine's speed: it began with the first.
    assert "The summarisers were down from t=" in summary
    assert "(the first summary request)" in summary
    assert re.search(r"\d+ requests answered 503", summary)
    assert "were deferred" in summary
    assert all(len(line) <= 100 for line in text.split("Sent", 1)[1].split("Done")[0].splitlines())
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unreachable_redis_given_explicitly_is_one_clear_error() -> None:
    with pytest.raises(DemoError, match=r"cannot reach Redis at 127\.0\.0\.1:1$"):
        run(documents=1, redis_url="redis://127.0.0.1:1/0")


def test_the_command_reports_an_unreachable_redis_in_one_line() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "polygate_celery",
            "demo",
            "--redis-url",
            "redis://:pw@127.0.0.1:1/0",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == "error: cannot reach Redis at 127.0.0.1:1\n"  # no password, no trace


def test_the_command_runs_the_pipeline_demo(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, object] = {}

    def recorded(**options: object) -> int:
        seen.update(options)
        return 0

    monkeypatch.setattr("polygate_celery.demo.pipeline.run", recorded)
    assert main(["demo", "--documents", "3", "--pages", "2", "--timeout", "90"]) == 0
    assert seen == {
        "documents": 3,
        "pages": 2,
        "redis_url": None,
        "timeout_s": 90.0,
        "plot": None,
        "keep": False,
    }


def test_with_keep_the_printed_commands_look_at_the_finished_run_and_stop_its_redis(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "polygate_celery", "demo", "--keep",
         "--documents", "2", "--pages", "1", "--timeout", "240"],
        env={**os.environ, "POLYGATE_REDIS_URL": ""},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    kept = re.search(r"^Kept its Redis \(pid (\d+)\)", done.stdout, re.MULTILINE)
    look = re.search(r"^  look: (.+)$", done.stdout, re.MULTILINE)
    stop = re.search(r"^  stop: (.+)$", done.stdout, re.MULTILINE)
    assert kept, done.stdout[-2000:]
    assert look
    assert stop
    server = psutil.Process(int(kept.group(1)))
    try:
        assert look.group(1) + " --watch" in done.stdout  # the command printed as it started
        status = subprocess.run(
            shlex.split(look.group(1)), capture_output=True, text=True, timeout=60, check=False
        )
        assert status.returncode == 0, status.stderr
        assert re.search(r"^summarise  chat +\S", status.stdout, re.MULTILINE), status.stdout
        assert "in 1h" not in status.stdout.split("SCOPE", 2)[1]  # it saw the run's successes
        stopped = subprocess.run(["bash", "-c", stop.group(1)], timeout=30, check=False)
        assert stopped.returncode == 0
        deadline = time.monotonic() + 10
        while not _ended(server):
            assert time.monotonic() < deadline, "the kept Redis is still running"
            time.sleep(0.1)
        assert not Path(shlex.split(look.group(1))[-1]).parent.exists()
    finally:
        with contextlib.suppress(psutil.Error):
            server.kill()


def _ended(process: psutil.Process) -> bool:
    """Gone, or a zombie its new parent has not reaped (not every init reaps)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
