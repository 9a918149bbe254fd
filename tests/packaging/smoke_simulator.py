"""Run in a virtualenv with `polygate_celery[simulator]` alone: the simulated provider starts
from its command line and answers a governed call."""

from __future__ import annotations

import subprocess
import sys

import stub_provider

server = subprocess.Popen(
    [sys.executable, "-m", "polygate_celery.testing.simulator", "--port", "0"],
    stdout=subprocess.PIPE,
    text=True,
)


try:
    assert server.stdout is not None
    base_url = server.stdout.readline().strip()
    text = stub_provider.ask({"base_url": base_url, "model": "sim-chat"})
    print(f"the simulator at {base_url} answered {text[:40]!r}")
finally:
    server.terminate()
    server.wait(10)
