"""One call to a source in a process of its own, printing what it cost as JSON.

``python -m tests.integration.sources.one_call ADAPTER URL REQUEST`` builds the
adapter (http, or sdk with a configured source's client) at the package's
default `max_body_bytes`, makes a warm-up call (imports, pools), then the call
measured: its outcome, how much the process's peak resident memory grew during
it (VmHWM, reset before the call; a busy machine does not change it), and the longest the event
loop went without running a ticker task that asks for a turn every 5 ms, in
CPU time of the loop's thread (which a busy machine does not change either)
and in wall-clock time.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import openai
from pydantic import SecretStr

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources import (
    ChatRequest,
    EmbeddingRequest,
    OpenAIHttpSource,
    OpenAISDKSource,
    Source,
    close_http_client,
)
from polygate_celery.sources.exchange import MAX_BODY_BYTES
from polygate_celery.sources.sdk_http import bounded_http_client

REQUESTS: dict[str, Any] = {
    "chat": ChatRequest([{"role": "user", "content": "hi"}], stream=False),
    "stream": ChatRequest([{"role": "user", "content": "hi"}], stream=True),
    "embeddings": EmbeddingRequest(["a", "b"]),
    "embeddings-2048": EmbeddingRequest(["a"] * 2048),
}
WARM_UP = ChatRequest([{"role": "user", "content": "warm up"}], stream=False)


def status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (Linux counts kB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def reset_peak() -> int:
    """Start counting the peak resident memory afresh; the resident memory now."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to VmRSS
    return status_bytes("VmRSS")


class Ticker:
    """How long the loop went between turns of a task that sleeps 5 ms at a time.

    `longest_cpu_s` counts the CPU time the loop's thread spent between two
    turns (the work that held the loop, whatever else the machine runs);
    `longest_s` the wall-clock time, which a busy machine stretches.
    """

    def __init__(self) -> None:
        self.longest_s = 0.0
        self.longest_cpu_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last, last_cpu = time.monotonic(), time.thread_time()
        while True:
            await asyncio.sleep(0.005)
            now, now_cpu = time.monotonic(), time.thread_time()
            self.longest_s = max(self.longest_s, now - last)
            self.longest_cpu_s = max(self.longest_cpu_s, now_cpu - last_cpu)
            last, last_cpu = now, now_cpu

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def build(adapter: str, url: str) -> tuple[Source, Any]:
    if adapter == "http":
        return OpenAIHttpSource(base_url=url, model="m", api_key=SecretStr("sk-x")), None
    client = openai.AsyncOpenAI(
        base_url=url, api_key="sk-x", http_client=bounded_http_client(MAX_BODY_BYTES)
    )
    return OpenAISDKSource(client, model="m"), client


async def main(adapter: str, url: str, request: str) -> None:
    source, client = build(adapter, url)
    warm = await source.send(WARM_UP, timeout_s=30)
    before = reset_peak()
    with Ticker() as ticker:
        await asyncio.sleep(0.02)
        started = time.monotonic()
        outcome: Outcome = await source.send(REQUESTS[request], timeout_s=60)
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.02)
    value = outcome.value
    vectors = getattr(value, "vectors", None)
    report = {
        "warm_up": warm.kind.value,
        "kind": outcome.kind.value,
        "reason": outcome.reason,
        "status": outcome.status,
        "growth": status_bytes("VmHWM") - before,
        "longest_stall_s": ticker.longest_s,
        "longest_stall_cpu_s": ticker.longest_cpu_s,
        "elapsed_s": elapsed,
        "vectors": None if vectors is None else [len(vectors), len(vectors[0])],
        "vector_types": None
        if vectors is None
        else sorted({type(vectors).__name__, *(type(v).__name__ for v in vectors)}),
        "float_types": None if vectors is None else sorted({type(x).__name__ for x in vectors[0]}),
        "text_length": len(getattr(value, "text", "") or ""),
    }
    if client is not None:
        await client.close()
    await close_http_client()
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
