"""Run in a virtualenv with `polygate_celery[celery]` alone: a real worker on Redis runs one
governed task against a stub endpoint. Arguments: the broker URL, a queue, a key prefix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import stub_provider

broker, queue, prefix = sys.argv[1:4]
here = Path(__file__).parent
config = here / "smoke.toml"
config.write_text(
    f"""
[store]
redis_url = "{broker}"
key_prefix = "{prefix}"

[sources.stub]
base_url = "{stub_provider.serve()}"
model = "stub"

[scopes.chat]
kind = "chat"
sources = ["stub"]
"""
)
env = {**os.environ, "SMOKE_BROKER": broker, "SMOKE_QUEUE": queue}
worker = subprocess.Popen(
    [sys.executable, "-m", "celery", "-A", "smoke_tasks", "worker", "-P", "prefork", "-c", "1",
     "-Q", queue, "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
    cwd=here, env={**env, "POLYGATE_CONFIG": str(config)},
)  # fmt: skip
try:
    os.environ.update(env)
    import smoke_tasks

    answer = smoke_tasks.ask.delay("hello").get(timeout=90)
    assert answer == stub_provider.REPLY, answer
    print(f"governed task answered {answer!r}")
finally:
    worker.terminate()
    worker.wait(30)
