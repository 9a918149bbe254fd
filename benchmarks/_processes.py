"""Child processes of the benchmarks: each in a session of its own, stopped with its pool."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_children: list[subprocess.Popen[bytes]] = []


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def git(*args: str) -> str | None:
    """What `git args` prints at the repository root, stripped, or None where git cannot run."""
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout.strip()


def head_commit() -> str | None:
    """The short commit the repository is at, or None where git cannot say."""
    return git("rev-parse", "--short", "HEAD") or None


def clean_env(*prefixes: str) -> dict[str, str]:
    """This environment without POLYGATE_* (it would override a written config) nor `prefixes`."""
    dropped = ("POLYGATE_", *prefixes)
    return {k: v for k, v in os.environ.items() if not k.startswith(dropped)}


def start_process(
    command: Sequence[str], env: dict[str, str], out: Path
) -> subprocess.Popen[bytes]:
    """Start `command` at the repository root, its output appended to `out`."""
    with out.open("ab") as sink:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return track(process)


def track(process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Have `stop_all` stop `process` too."""
    _children.append(process)
    return process


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM to its process group (a prefork pool's children too), then SIGKILL."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # any child left behind by the pool
    if process in _children:
        _children.remove(process)


def stop_all() -> None:
    """Stop every process still running that `start_process` started."""
    for process in list(_children):
        stop_process(process, grace_s=5.0)
