"""A quota no one declared, learned from the provider's own rate-limit headers.

A token-bucket provider of 120 requests a minute that says so on every answer
(OpenAI's or Anthropic's headers), no rpm in the configuration: after the
bucket's first minute, calls wait for the refill instead of meeting 429s.
Without the headers the same run meets about one 429 per call past the burst.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("aiohttp", reason="the simulator is an extra: polygate_celery[simulator]")

from polygate_celery import Gateway, parse_config
from polygate_celery.sources import close_http_client
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.conftest import CANARY_KEY

RPM = 120
CALLS = 140  # the bucket's 120, then 20 more at one every 0.5 s: about 10 s
IN_FLIGHT = 16


@pytest.fixture
def provider() -> Iterator[SimulatedProvider]:
    """A fresh provider per test: its buckets start full."""
    models = {
        style: ModelBehaviour(
            api_key=CANARY_KEY,
            rpm=RPM,
            rate_limiter="bucket",
            ratelimit_headers=style,  # type: ignore[arg-type]
            latency_s=(0.05, 0.05),
        )
        for style in ("openai", "anthropic")
    }
    with SimulatedProvider(models) as provider:
        yield provider


@pytest.mark.parametrize("adapter", ["http", "openai-sdk"])
@pytest.mark.parametrize("style", ["openai", "anthropic"])
async def test_an_announced_quota_is_kept_without_being_declared(
    provider: SimulatedProvider, style: str, adapter: str
) -> None:
    source = {"base_url": provider.url, "api_key": CANARY_KEY, "model": style}
    source |= {"adapter": adapter, "max_concurrency": IN_FLIGHT, "timeout_s": 5.0}
    config = parse_config(
        {
            "sources": {"hosted": source},
            "scopes": {"s": {"kind": "chat", "sources": ["hosted"], "stall_window_s": 60}},
        }
    )
    provider.reset_journal()
    gateway = Gateway(config)
    try:
        answers = await calls(gateway, CALLS)
        learned = (await gateway.snapshot("s"))[0].learned_rpm
    finally:
        await gateway.aclose()
        await close_http_client()
    assert len(answers) == CALLS
    refused = sum(1 for entry in provider.journal if entry.outcome.startswith("429"))
    assert learned == RPM
    # Learned from the first answers, before the bucket empties: (almost) none refused.
    assert refused <= 4, f"{refused} answered 429 of {len(provider.journal)}"


async def calls(gateway: Gateway, n: int) -> list[Any]:
    limit = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> Any:
        async with limit:
            return await gateway.chat("s", [{"role": "user", "content": "hi"}])

    return await asyncio.gather(*(one() for _ in range(n)))
