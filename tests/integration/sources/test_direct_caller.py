"""A direct caller never hangs on a scope that never answered (SPEC §3 rule 15 as amended).

One `Gateway` call at a time, as code that awaits it makes them, over real sockets:
the simulated provider, or a route that accepts and never answers. Package
defaults, with ``timeout_s = 10``. On a lone source each call ends with a typed
error within 40 s (three attempts and their backoffs, not a stall window); with a
fallback, the fallback serves it within 15 s of the fault.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from polygate_celery import AllSourcesExhausted, Gateway, SourceFatalError, parse_config
from polygate_celery.sources import ChatResult, close_http_client
from polygate_celery.testing.simulator import SimulatedProvider
from tests.conftest import CANARY_KEY
from tests.integration.sources.rawserver import RawServer

# (case, the simulator's model or "silent", whether the call streams)
FAULTS = [
    ("every request 5xx", "e500", False),
    ("a cut stream", "cut", True),
    ("a malformed chunk", "malformed-chunk", True),
    ("timeouts", "slow", False),  # answers after 30 s
    ("a silent route", "silent", False),  # accepts, reads the request, never answers
]
LONE_S = 40.0
FALLBACK_S = 15.0
HI = [{"role": "user", "content": "hi"}]


async def never_answer(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)


@pytest_asyncio.fixture
async def silent_url() -> AsyncIterator[str]:
    async with RawServer(never_answer) as server:
        yield server.url


@pytest_asyncio.fixture
async def build(provider: SimulatedProvider, silent_url: str) -> AsyncIterator[Any]:
    """A gateway over the faulty source (and the healthy fallback when asked), defaults
    but for ``timeout_s = 10``; closed after the test."""
    made: list[Gateway] = []

    def gateway(model: str, *, fallback: bool) -> Gateway:
        def source(name: str) -> dict[str, Any]:
            url = silent_url if name == "silent" else provider.url
            return {"base_url": url, "api_key": CANARY_KEY, "timeout_s": 10, "model": name}

        sources = {"primary": source(model)}
        if fallback:
            sources["backup"] = source("fallback")
        config = parse_config(
            {"sources": sources, "scopes": {"s": {"kind": "chat", "sources": list(sources)}}}
        )
        made.append(Gateway(config))
        return made[-1]

    yield gateway
    for gateway in made:
        await gateway.aclose()
    await close_http_client()


@pytest.mark.parametrize(("case", "model", "stream"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_a_lone_source_ends_each_call_with_a_typed_error_in_bounded_time(
    build: Any, case: str, model: str, stream: bool
) -> None:
    gateway = build(model, fallback=False)
    started = time.monotonic()
    with pytest.raises((AllSourcesExhausted, SourceFatalError)) as caught:
        await gateway.chat("s", HI, stream=stream)
    took = time.monotonic() - started
    assert took < LONE_S, f"{case}: {took:.1f} s"
    if isinstance(caught.value, AllSourcesExhausted):
        assert caught.value.reason == "retry_exhausted", case
        assert caught.value.attempts == 3  # max_attempts, the default


@pytest.mark.parametrize(("case", "model", "stream"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_the_fallback_serves_each_call_within_15_s_of_the_fault(
    build: Any, case: str, model: str, stream: bool
) -> None:
    gateway = build(model, fallback=True)
    started = time.monotonic()
    result = await gateway.chat("s", HI, stream=stream)
    took = time.monotonic() - started
    assert result.source == "backup", case
    assert result.value == ChatResult("the fallback's answer", "stop")
    assert took < FALLBACK_S, f"{case}: {took:.1f} s"
