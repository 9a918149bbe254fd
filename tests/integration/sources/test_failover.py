"""A faulty primary and a healthy fallback in one scope, through the Gateway, per fault."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from polygate_celery import Gateway, SourceFatalError, parse_config
from polygate_celery.sources import ChatResult, close_http_client
from polygate_celery.testing.simulator import SimulatedProvider
from tests.conftest import CANARY_KEY

FAST = {"poll_interval_s": 0.05, "backoff_base_s": 0.05, "backoff_max_s": 0.2}


@pytest_asyncio.fixture
async def scope_with(provider: SimulatedProvider) -> AsyncIterator[Any]:
    """Build a gateway whose scope "s" is [primary model, "fallback"]; close it after."""
    made: list[Gateway] = []

    def build(primary: str, kind: str = "chat", **source: Any) -> Gateway:
        settings = {"base_url": provider.url, "api_key": CANARY_KEY, "timeout_s": 2.0, **source}
        config = parse_config(
            {
                "sources": {
                    "primary": {**settings, "model": primary},
                    "backup": {**settings, "model": "fallback"},
                },
                "scopes": {"s": {"kind": kind, "sources": ["primary", "backup"], **FAST}},
            }
        )
        gateway = Gateway(config)
        made.append(gateway)
        return gateway

    provider.reset_journal()
    yield build
    for gateway in made:
        await gateway.aclose()
    await close_http_client()


def sent(provider: SimulatedProvider, model: str) -> int:
    return sum(1 for entry in provider.journal if entry.model == model)


async def test_retry_after_is_honoured_fleet_wide(
    scope_with: Any, provider: SimulatedProvider
) -> None:
    gateway = scope_with("ratelimit-seconds")  # 429 with Retry-After: 7
    for _ in range(3):
        result = await gateway.chat("s", [{"role": "user", "content": "hi"}])
        assert result.source == "backup"
    assert sent(provider, "ratelimit-seconds") == 1  # nothing more before the hint
    assert (await gateway.snapshot("s"))[0].paused_for_s > 6


@pytest.mark.parametrize(
    ("primary", "source", "tries"),
    [
        ("slow", {"timeout_s": 0.5}, 1),
        ("stall", {"stream": True, "stream_idle_timeout_s": 0.3}, 1),
        ("slow-first-token", {"ttft_timeout_s": 0.3}, 1),
        ("e500", {}, 2),  # a 5xx is retried once on the preferred source
        ("outage", {}, 2),
        ("malformed-body", {}, 1),
        ("malformed-chunk", {"stream": True}, 1),  # moves at once, as a malformed body does
    ],
)
async def test_a_failing_primary_is_not_retried_while_the_fallback_is_open(
    scope_with: Any,
    provider: SimulatedProvider,
    primary: str,
    source: dict[str, Any],
    tries: int,
) -> None:
    gateway = scope_with(primary, **source)
    started = time.monotonic()
    result = await gateway.chat("s", [{"role": "user", "content": "hi"}])
    assert result.value == ChatResult("the fallback's answer", "stop")
    assert sent(provider, primary) == tries
    assert [a.source for a in result.attempts] == ["primary"] * tries + ["backup"]
    assert time.monotonic() - started < gateway.plan("s").max_call_s


@pytest.mark.parametrize("primary", ["cut", "malformed-chunk"])
async def test_a_truncated_stream_is_never_returned(
    scope_with: Any, provider: SimulatedProvider, primary: str
) -> None:
    gateway = scope_with(primary, stream=True)
    result = await gateway.chat("s", [{"role": "user", "content": "hi"}])
    assert result.source == "backup"
    assert result.value == ChatResult("the fallback's answer", "stop")


async def test_a_stream_with_its_final_chunk_completes_at_once_without_done(
    scope_with: Any,
) -> None:
    gateway = scope_with("no-done", stream=True, stream_idle_timeout_s=5.0)
    started = time.monotonic()
    result = await gateway.chat("s", [{"role": "user", "content": "hi"}])
    assert (result.source, result.value.text) == ("primary", "complete without done")
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("kind", ["chat", "ocr"])
async def test_a_context_length_rejection_is_served_by_the_fallback(
    scope_with: Any, provider: SimulatedProvider, kind: str
) -> None:
    gateway = scope_with("context", kind=kind)
    if kind == "chat":
        result = await gateway.chat("s", [{"role": "user", "content": "a long prompt"}])
    else:
        result = await gateway.ocr("s", b"x" * 64)
    assert result.source == "backup"
    assert sent(provider, "context") == 1
    assert [a.outcome for a in result.attempts] == ["source_rejected", "success"]


async def test_a_content_policy_rejection_is_raised_at_once_with_the_reason(
    scope_with: Any, provider: SimulatedProvider
) -> None:
    gateway = scope_with("policy")
    with pytest.raises(SourceFatalError) as caught:
        await gateway.chat("s", [{"role": "user", "content": "something unsafe"}])
    assert "safety system" in caught.value.reason
    assert (caught.value.attempts, caught.value.status) == (1, 400)
    assert sent(provider, "fallback") == 0


async def test_rejected_credentials_move_to_the_fallback_and_open_the_breaker(
    scope_with: Any, provider: SimulatedProvider
) -> None:
    gateway = scope_with("wrong-key")
    assert (await gateway.chat("s", [{"role": "user", "content": "hi"}])).source == "backup"
    assert (await gateway.chat("s", [{"role": "user", "content": "hi"}])).source == "backup"
    assert sent(provider, "wrong-key") == 1
    assert (await gateway.snapshot("s"))[0].breaker == "open"


async def test_the_result_names_the_model_and_usage_that_served_it(scope_with: Any) -> None:
    gateway = scope_with("e500")
    result = await gateway.chat("s", [{"role": "user", "content": "hi"}])
    assert (result.source, result.model) == ("backup", "fallback")
    assert result.prompt_tokens is not None
    assert result.completion_tokens is not None


async def test_embeddings_fail_over_too(scope_with: Any, provider: SimulatedProvider) -> None:
    gateway = scope_with("e500", kind="embedding")
    result = await gateway.embed("s", ["one", "two"])
    assert result.source == "backup"
    assert len(result.value.vectors) == 2
