"""Run in a virtualenv with `polygate_celery[simulator]` alone: the simulated provider starts
from its command line and answers a governed call."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from polygate_celery import Gateway, parse_config

server = subprocess.Popen(
    [sys.executable, "-m", "polygate_celery.testing.simulator", "--port", "0"],
    stdout=subprocess.PIPE,
    text=True,
)


async def main(base_url: str) -> None:
    config = parse_config(
        {
            "sources": {"sim": {"base_url": base_url, "model": "sim-chat"}},
            "scopes": {"chat": {"kind": "chat", "sources": ["sim"]}},
        }
    )
    gateway = Gateway(config)
    try:
        outcome = await gateway.chat("chat", [{"role": "user", "content": "hello"}])
    finally:
        await gateway.aclose()
    print(f"the simulator at {base_url} answered {outcome.value.text[:40]!r}")


try:
    assert server.stdout is not None
    asyncio.run(main(server.stdout.readline().strip()))
finally:
    server.terminate()
    server.wait(10)
