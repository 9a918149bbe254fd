"""`python -m examples.pipeline.send`, the documented way to send documents into the
compose fleet, run as its containers run it: a real worker of the example pipeline, the
simulated provider and a Redis, configured by the compose file's variables."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.conftest import own_redis

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pipeline"
WORKER = [sys.executable, "-m", "celery", "-A", "examples.pipeline.tasks", "worker",
          "--pool", "threads", "--concurrency", "8", "--loglevel", "ERROR",
          "--without-heartbeat", "--without-mingle", "--without-gossip"]  # fmt: skip


@contextlib.contextmanager
def worker(env: Mapping[str, str]) -> Iterator[None]:
    """The compose file's worker command, in a session of its own, stopped on the way out."""
    process = subprocess.Popen(
        WORKER, cwd=ROOT, env=dict(env), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def test_send_prints_a_summary_per_document(tmp_path: Path) -> None:
    models = json.loads((EXAMPLE / "models.json").read_text(encoding="utf-8"))
    behaviours = {name: ModelBehaviour.from_dict(spec) for name, spec in models.items()}
    with own_redis() as url, SimulatedProvider(behaviours) as provider:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "POLYGATE_CONFIG": str(EXAMPLE / "polygate.toml"),
            "POLYGATE_STORE__REDIS_URL": url,
            "POLYGATE_STORE__KEY_PREFIX": f"send-{uuid.uuid4().hex[:8]}",
        }
        config = tomllib.loads((EXAMPLE / "polygate.toml").read_text(encoding="utf-8"))
        for source in config["sources"]:
            env[f"POLYGATE_SOURCES__{source.upper()}__BASE_URL"] = provider.url
        with worker(env):
            done = subprocess.run(
                [sys.executable, "-m", "examples.pipeline.send", "2", "--pages", "1",
                 "--timeout", "120"],
                cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    lines = done.stdout.splitlines()
    assert lines[0] == "sent 2 documents of 1 pages"
    assert len(lines) == 3
    for line in lines[1:]:
        assert line.endswith(": A short summary of the document."), line
