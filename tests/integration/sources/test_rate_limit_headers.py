"""The provider's rate-limit headers ride on every outcome built from its answer, both adapters."""

from __future__ import annotations

import asyncio
import datetime
import json
import time

import pytest

from polygate_celery.core.outcome import Outcome, OutcomeKind, RateLimits
from polygate_celery.sources import ChatRequest, EmbeddingRequest
from tests.integration.sources.conftest import SourceFactory
from tests.integration.sources.rawserver import RawServer, Writer, chunk, response

OPENAI = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-tokens": "6m0s",
}
OPENAI_LIMITS = RateLimits(60, 59, 1.0, 150000, 149984, 360.0)
ANTHROPIC = {
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "0",
    "anthropic-ratelimit-requests-reset": "2020-01-01T00:00:00Z",  # passed: resets now
    "anthropic-ratelimit-tokens-limit": "40000",
    "anthropic-ratelimit-tokens-remaining": "12",
    "anthropic-ratelimit-tokens-reset": "in a while",  # unreadable: no reset
}
ANTHROPIC_LIMITS = RateLimits(50, 0, 0.0, 40000, 12, None)
STYLES = {"openai": (OPENAI, OPENAI_LIMITS), "anthropic": (ANTHROPIC, ANTHROPIC_LIMITS)}

COMPLETION = {"model": "raw", "choices": [{"index": 0, "message": {"content": "hi"}}]}
ERRORS = {
    429: (OutcomeKind.RATE_LIMITED, {"error": {"message": "slow down"}}),
    500: (OutcomeKind.TRANSIENT, {"error": {"message": "boom"}}),
    400: (OutcomeKind.FATAL, {"error": {"message": "bad temperature"}}),
    401: (OutcomeKind.REJECTED, {"error": {"message": "bad key"}}),
}


def extra(headers: dict[str, str]) -> str:
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


def answer(status: int, body: object, headers: dict[str, str]) -> Writer:
    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(response(status, json.dumps(body), extra=extra(headers)))
        await writer.drain()

    return write


def stream(headers: dict[str, str], *, whole: bool = True) -> Writer:
    async def write(writer: asyncio.StreamWriter) -> None:
        head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{extra(headers)}"
        writer.write(f"{head}connection: close\r\n\r\n".encode() + chunk({"content": "hi"}))
        if whole:
            writer.write(chunk({}, "stop") + chunk(None, usage={"prompt_tokens": 1}))
        await writer.drain()

    return write


async def ask(
    make_source: SourceFactory, respond: Writer, request: object, **options: object
) -> Outcome:
    async with RawServer(respond) as server:
        return await make_source("raw", url=server.url, **options).send(request, timeout_s=5.0)


HELLO = ChatRequest([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_success_carries_the_rate_limits(
    make_source: SourceFactory, style: str, streamed: bool
) -> None:
    headers, limits = STYLES[style]
    respond = stream(headers) if streamed else answer(200, COMPLETION, headers)
    outcome = await ask(make_source, respond, HELLO, stream=streamed)
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.limits == limits


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("status", sorted(ERRORS))
async def test_an_error_answer_carries_the_rate_limits(
    make_source: SourceFactory, style: str, streamed: bool, status: int
) -> None:
    headers, limits = STYLES[style]
    kind, body = ERRORS[status]
    outcome = await ask(make_source, answer(status, body, headers), HELLO, stream=streamed)
    assert (outcome.kind, outcome.status) == (kind, status)
    assert outcome.limits == limits


async def test_a_cut_stream_and_a_malformed_answer_carry_the_rate_limits(
    make_source: SourceFactory,
) -> None:
    cut = await ask(make_source, stream(OPENAI, whole=False), HELLO, stream=True)
    assert cut.reason == "stream cut before its final chunk"
    assert cut.limits == OPENAI_LIMITS
    bad = await ask(make_source, answer(200, {"data": []}, OPENAI), EmbeddingRequest(["a"]))
    assert bad.reason == "malformed embeddings"
    assert bad.limits == OPENAI_LIMITS


async def test_an_anthropic_reset_instant_is_seconds_from_now(make_source: SourceFactory) -> None:
    soon = datetime.datetime.fromtimestamp(time.time() + 30, tz=datetime.UTC)
    headers = {"anthropic-ratelimit-tokens-reset": soon.isoformat()}
    outcome = await ask(make_source, answer(200, COMPLETION, headers), HELLO)
    assert outcome.limits is not None
    assert outcome.limits.tokens_reset_s is not None
    assert 27 < outcome.limits.tokens_reset_s <= 30


async def test_an_answer_without_rate_limit_headers_has_no_limits(
    make_source: SourceFactory,
) -> None:
    outcome = await ask(make_source, answer(200, COMPLETION, {}), HELLO)
    assert (outcome.kind, outcome.limits) == (OutcomeKind.SUCCESS, None)
