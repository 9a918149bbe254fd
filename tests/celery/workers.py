"""`celery worker` processes for the tests that need real pools, signals and kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def toml(data: Mapping[str, Any], prefix: str = "") -> str:
    """A small TOML writer for configuration dictionaries (tables, scalars, lists)."""
    lines, tables = [], []
    for key, value in data.items():
        if isinstance(value, Mapping):
            tables.append((f"{prefix}{key}", value))
        else:
            lines.append(f"{key} = {_scalar(value)}")
    out = "\n".join(lines)
    for name, table in tables:
        out += f"\n\n[{name}]\n" + toml(table, f"{name}.")
    return out.strip() + "\n"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@contextmanager
def celery_worker(
    config: Mapping[str, Any],
    broker: str,
    tmp_path: Path,
    *,
    pool: str = "prefork",
    concurrency: int = 2,
    settings: Mapping[str, str] | None = None,
    queues: str = "polygate-tests",
    loglevel: str = "WARNING",
    logfile: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process for the test app, consuming `queues`, logging at `loglevel` (to
    `logfile` if given); stopped (warm, then cold) afterwards."""
    path = tmp_path / f"polygate-{time.monotonic_ns()}.toml"
    path.write_text(toml(config))
    env = {
        **os.environ,
        "POLYGATE_CONFIG": str(path),
        "POLYGATE_TEST_BROKER": broker,
        **(settings or {}),
    }
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.celery.app",
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-Q",
        queues,
        "--loglevel",
        loglevel,
        *(["--logfile", str(logfile)] if logfile is not None else []),
        "--without-heartbeat",
        "--without-mingle",
        "--without-gossip",
    ]
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
