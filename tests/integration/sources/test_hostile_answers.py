"""Hostile answers cost at most the body limit: bytes received and memory measured, both adapters.

Each server below would send 64 times `max_body_bytes` (without a Content-Length
the client could refuse up front); a bounded adapter stops reading just past the
limit. What the client received is counted by a transport under its HTTP client,
and the process's resident memory is sampled while the answer is read.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import psutil
import pytest
from pydantic import SecretStr

from polygate_celery.core.outcome import Outcome, OutcomeKind
from polygate_celery.sources import (
    ChatRequest,
    EmbeddingRequest,
    OpenAIHttpSource,
    OpenAISDKSource,
    Source,
)
from polygate_celery.sources.sdk_http import bounded_http_client
from tests.conftest import CANARY_KEY
from tests.integration.sources.conftest import sdk_http_library
from tests.integration.sources.rawserver import RawServer, chunk, response, sse_head

LIMIT = 4 * 1024 * 1024
PIECE = 64 * 1024
SLACK = 4 * PIECE  # reads arrive a network chunk at a time
FLOOD = 64 * LIMIT

OK = response(200, '{"model":"m","choices":[{"index":0,"message":{"content":"hi"}}]}')
JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
ERROR_HEAD = b"HTTP/1.1 500 X\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
LIMITED_HEAD = (
    b"HTTP/1.1 429 X\r\ncontent-type: application/json\r\nretry-after: 3\r\n"
    b"x-ratelimit-remaining-requests: 0\r\nconnection: close\r\n\r\n"
)
HUGE_CHUNK = b'data: {"model":"m","choices":[{"index":0,"delta":{"content":"'
CHAT = ChatRequest([{"role": "user", "content": "hi"}], stream=False)
STREAM = ChatRequest([{"role": "user", "content": "hi"}], stream=True)

HOSTILE = {
    # (head and opening bytes, the piece repeated after them, request)
    "sse-without-a-line-break": (sse_head() + b"data: ", b"x" * PIECE, STREAM),
    "sse-one-huge-chunk": (sse_head() + HUGE_CHUNK, b"x" * PIECE, STREAM),
    "sse-endless-chunks": (sse_head(), chunk({"content": "x" * 1000}) * 60, STREAM),
    "huge-completion": (JSON_HEAD + b'{"choices": "', b"x" * PIECE, CHAT),
    "huge-completion-to-a-stream-request": (JSON_HEAD, b" " * PIECE, STREAM),
    "huge-embeddings": (
        JSON_HEAD + b'{"data": [',
        b"-0.0123456789012345, " * (PIECE // 21),  # floats as providers print them
        EmbeddingRequest(["a"]),
    ),
    "huge-error": (ERROR_HEAD + b'{"error": "', b"x" * PIECE, CHAT),
}


class Flood:
    """Answers the first request (a warm-up) plainly, every later one with a flood."""

    def __init__(self, head: bytes, piece: bytes) -> None:
        self.head, self.piece = head, piece
        self.requests = 0

    async def __call__(self, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        if self.requests == 1:
            writer.write(OK)
            await writer.drain()
            return
        writer.write(self.head)
        sent = 0
        while sent < FLOOD:
            writer.write(self.piece)
            sent += len(self.piece)
            await writer.drain()


def counting_transport(library: Any) -> Any:
    """A transport of `library` (httpx or httpx2) counting the body bytes it receives."""

    class Counted(library.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, stream: Any, owner: Any) -> None:
            self.stream, self.owner = stream, owner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for part in self.stream:
                self.owner.received += len(part)
                yield part

        async def aclose(self) -> None:
            await self.stream.aclose()

    class Counting(library.AsyncBaseTransport):  # type: ignore[misc]
        received = 0

        def __init__(self) -> None:
            self.inner = library.AsyncHTTPTransport()

        async def handle_async_request(self, request: Any) -> Any:
            answer = await self.inner.handle_async_request(request)
            answer.stream = Counted(answer.stream, self)
            return answer

        async def aclose(self) -> None:
            await self.inner.aclose()

    return Counting()


def resident_bytes() -> int:
    """The process's resident memory now."""
    return int(psutil.Process().memory_info().rss)


class Peak:
    """The most resident memory the process held above where it started, sampled every 2 ms."""

    def __init__(self) -> None:
        self.start = self.most = resident_bytes()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(0.002):
            self.most = max(self.most, resident_bytes())

    @property
    def growth(self) -> int:
        return self.most - self.start

    def __enter__(self) -> Peak:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


ADAPTERS = ("http", "sdk", "sdk-unhooked")
"""http; the SDK with a configured source's client; the SDK with a plain client of yours.
The last reads an error answer whole (the SDK does, unless its client has the
`body_limit` hook): the cells of error answers leave it out, as documented."""
BOUNDED_ERRORS = ("http", "sdk")


def build(kind: str, url: str, transport: Any) -> tuple[Source, Any]:
    if kind == "http":
        client = httpx.AsyncClient(transport=transport)
        source = OpenAIHttpSource(
            base_url=url,
            model="m",
            api_key=SecretStr(CANARY_KEY),
            client=client,
            max_body_bytes=LIMIT,
        )
        return source, client
    library = sdk_http_library()
    if kind == "sdk":
        http_client = bounded_http_client(LIMIT, transport=transport)
    else:
        http_client = library.AsyncClient(transport=transport)
    sdk = openai.AsyncOpenAI(base_url=url, api_key=CANARY_KEY, http_client=http_client)
    return OpenAISDKSource(sdk, model="m", max_body_bytes=LIMIT), http_client


async def flooded(
    kind: str, head: bytes, piece: bytes, request: object
) -> tuple[Outcome, int, int]:
    """(outcome, body bytes received, memory growth) of one request answered with a flood."""
    library = httpx if kind == "http" else sdk_http_library()
    transport = counting_transport(library)
    async with RawServer(Flood(head, piece)) as server:
        source, client = build(kind, server.url, transport)
        try:
            warm = await source.send(CHAT, timeout_s=5)  # imports and pools, before measuring
            assert warm.kind is OutcomeKind.SUCCESS
            transport.received = 0
            with Peak() as peak:
                started = time.monotonic()
                outcome = await source.send(request, timeout_s=20)
                elapsed = time.monotonic() - started
        finally:
            await client.aclose()
    assert elapsed < 10
    return outcome, transport.received, peak.growth


@pytest.mark.parametrize(
    ("adapter", "hostile"),
    [(a, h) for a in ADAPTERS for h in sorted(HOSTILE) if h != "huge-error" or a in BOUNDED_ERRORS],
)
async def test_a_hostile_answer_is_refused_at_the_body_limit(adapter: str, hostile: str) -> None:
    head, piece, request = HOSTILE[hostile]
    outcome, received, growth = await flooded(adapter, head, piece, request)
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.TRANSIENT,
        f"an answer larger than {LIMIT} bytes",
    )
    assert LIMIT < received <= LIMIT + SLACK
    assert growth < 5 * LIMIT


@pytest.mark.parametrize("adapter", BOUNDED_ERRORS)
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_flooding_429_is_rate_limited_without_reading_it(
    adapter: str, streamed: bool
) -> None:
    request = STREAM if streamed else CHAT
    outcome, received, growth = await flooded(adapter, LIMITED_HEAD, b"x" * PIECE, request)
    assert (outcome.kind, outcome.retry_after_s) == (OutcomeKind.RATE_LIMITED, 3.0)
    assert outcome.limits is not None
    assert outcome.limits.requests_remaining == 0
    assert received <= SLACK
    assert growth < 5 * LIMIT
