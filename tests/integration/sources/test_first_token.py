"""A first-token limit is a failover trigger (SPEC §3 rule 17), over real sockets.

A direct `Gateway` at the package defaults (a streamed chat source's first-token
limit is 15 s when `ttft_timeout_s` is unset; `timeout_s` 60 s) against the
simulated provider: a stuck first token with a fallback is served by the
fallback at the limit, without a backoff between; a lone source whose first
token comes at 20 s answers.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from polygate_celery import Gateway, parse_config
from polygate_celery.core.outcome import OutcomeKind
from polygate_celery.sources import ChatRequest, ChatResult, close_http_client
from polygate_celery.sources.factory import DEFAULT_TTFT_S
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.conftest import CANARY_KEY
from tests.integration.sources.conftest import SourceFactory

HELLO = [{"role": "user", "content": "hi"}]
MODELS = {
    "stuck": ModelBehaviour(api_key=CANARY_KEY, stream_fault="slow_first_token"),  # 30 s
    "late": ModelBehaviour(api_key=CANARY_KEY, first_token_s=20.0, reply="slow but healthy"),
    "a-second-late": ModelBehaviour(api_key=CANARY_KEY, first_token_s=1.0, reply="in a second"),
    "fallback": ModelBehaviour(api_key=CANARY_KEY, reply="the fallback's answer"),
}
# What the machine may add between two attempts (admission, the loop's turn), far below
# the backoff that used to sit there (1 to 2 s after a first failure).
OVERHEAD_S = 1.0


@pytest.fixture(scope="module")
def simulated() -> Iterator[SimulatedProvider]:
    with SimulatedProvider(MODELS) as provider:
        yield provider


@pytest_asyncio.fixture
async def gateway_of(simulated: SimulatedProvider) -> AsyncIterator[Any]:
    """A direct gateway, package defaults, whose scope "s" streams from `models` in order."""
    made: list[Gateway] = []

    def build(*models: str) -> Gateway:
        settings = {"base_url": simulated.url, "api_key": CANARY_KEY, "stream": True}
        names = [f"source-{model}" for model in models]
        config = parse_config(
            {
                "sources": {
                    n: {**settings, "model": m} for n, m in zip(names, models, strict=True)
                },
                "scopes": {"s": {"kind": "chat", "sources": names}},
            }
        )
        made.append(Gateway(config))
        return made[-1]

    yield build
    for gateway in made:
        await gateway.aclose()
    await close_http_client()


async def test_a_stuck_first_token_is_served_by_the_fallback_at_the_limit(
    gateway_of: Any,
) -> None:
    gateway = gateway_of("stuck", "fallback")
    started = time.monotonic()
    result = await gateway.chat("s", HELLO)
    elapsed = time.monotonic() - started
    assert result.value == ChatResult("the fallback's answer", "stop")
    cut, served = result.attempts
    assert (cut.source, cut.reason) == ("source-stuck", "no first token within ttft_timeout_s")
    assert DEFAULT_TTFT_S <= cut.seconds < DEFAULT_TTFT_S + OVERHEAD_S
    assert served.started_s - (cut.started_s + cut.seconds) < OVERHEAD_S  # no backoff
    assert elapsed - served.seconds < DEFAULT_TTFT_S + OVERHEAD_S


async def test_a_lone_sources_first_token_at_20_s_answers(gateway_of: Any) -> None:
    gateway = gateway_of("late")
    started = time.monotonic()
    result = await gateway.chat("s", HELLO)
    assert result.value == ChatResult("slow but healthy", "stop")
    assert len(result.attempts) == 1
    assert 20.0 <= time.monotonic() - started < gateway.plan("s").max_call_s


async def test_the_first_token_limit_is_the_callers_to_lift(
    make_source: SourceFactory, simulated: SimulatedProvider
) -> None:
    source: Any = make_source("a-second-late", url=simulated.url, stream=True, ttft_timeout_s=0.3)
    streamed = ChatRequest(HELLO, stream=True)
    assert source.limits_first_token(streamed)
    assert not source.limits_first_token(ChatRequest(HELLO, stream=False))
    cut = await source.send(streamed, timeout_s=10.0)
    assert (cut.timed_out, cut.first_token_cut) == (True, True)
    waited = await source.send(streamed, timeout_s=10.0, first_token_limit=False)
    assert waited.kind is OutcomeKind.SUCCESS
    assert waited.value.text == "in a second"
    late = await source.send(streamed, timeout_s=0.5, first_token_limit=False)
    assert (late.timed_out, late.first_token_cut) == (True, False)  # timeout_s still holds
