"""`polygate-celery demo` as a process manager sees it: SIGTERM and SIGHUP stop it as
Ctrl-C does, with nothing it started left running and its temporary files removed;
while it runs, the status command it prints reads its Redis."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 90.0  # generous: a busy machine starts a Celery worker slowly


@dataclass
class RunningDemo:
    process: subprocess.Popen[bytes]
    log: Path
    started: list[psutil.Process]  # every process the demo started, the worker among them

    @property
    def output(self) -> str:
        return self.log.read_text()

    def status_command(self) -> str:
        found = re.search(r"while it runs:\n  (.+) --watch\n", self.output)
        assert found, self.output
        return found.group(1)


def _is_worker(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        command = process.cmdline()
        return "celery" in command and "worker" in command
    return False


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[RunningDemo]:
    """The demo with its defaults on its embedded Redis, once its worker runs and the
    tasks are sent; in its own process group, as a service manager starts it."""
    log = tmp_path / "demo.out"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "polygate_celery", "demo", "--timeout", "240"],
            cwd=ROOT,
            env={**os.environ, "POLYGATE_REDIS_URL": ""},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = RunningDemo(process, log, [])
    try:
        parent = psutil.Process(process.pid)
        deadline = time.monotonic() + STARTUP_S
        while "Sent " not in running.output or not any(
            _is_worker(p) for p in parent.children(recursive=True)
        ):
            assert process.poll() is None, running.output
            assert time.monotonic() < deadline, f"the demo did not start:\n{running.output}"
            time.sleep(0.2)
        running.started = parent.children(recursive=True)
        yield running
    finally:
        if process.poll() is None:  # as a user stops it: it cleans up after itself
            process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        for leftover in running.started:
            with contextlib.suppress(psutil.Error):
                leftover.kill()


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["SIGTERM", "SIGHUP", "Ctrl-C"]
)
def test_a_signal_stops_the_demo_and_everything_it_started(
    demo: RunningDemo, signum: signal.Signals
) -> None:
    names = [p.name() for p in demo.started]
    assert any(_is_worker(p) for p in demo.started), names
    assert any(re.match(r"(redis|valkey)-server", name) for name in names), names
    config = Path(shlex.split(demo.status_command())[-1])
    assert config.exists()

    os.kill(demo.process.pid, signum)  # the demo alone, as `kill` and `timeout` do
    try:
        status = demo.process.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the demo did not stop within 30 s of {signum.name}:\n{demo.output}")
    assert status == 128 + signum, demo.output
    _, alive = psutil.wait_procs(demo.started, timeout=10)
    assert not alive, [(p.pid, p.name()) for p in alive]
    if signum != signal.SIGINT:  # Ctrl-C stays quiet, as everywhere in the command line
        assert f"polygate-celery demo: stopped by {signum.name}\n" in demo.output
    assert not config.parent.exists()  # the run's directory, its Redis data with it


def test_the_status_command_it_prints_reads_the_running_demo(demo: RunningDemo) -> None:
    done = subprocess.run(
        shlex.split(demo.status_command()),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"redis 127\.0\.0\.1:\d+  prefix demo-[0-9a-f]{8}", done.stdout)
    for scope in ("ocr", "embed", "summarise"):
        assert re.search(rf"^{scope} ", done.stdout, re.MULTILINE), done.stdout
