"""A 2xx answer in a charset other than UTF-8's, or that is not UTF-8, is malformed, both adapters.

Before, a body declared ``charset=punycode`` was decoded on the event loop by
Python's quadratic decoder (800 KB froze it 65 s), and invalid UTF-8 became
U+FFFD in a success. Now such an answer is refused unread (another charset) or
as it is read (bytes that are not UTF-8): a transient outcome, HTTP 200, whose
reason says it is malformed, within a fraction of a second, the loop never
held. An error answer's charset is never used either: its text is read as UTF-8.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from pydantic import SecretStr

from polygate_celery.core.outcome import Outcome, OutcomeKind
from polygate_celery.sources import ChatRequest, OpenAIHttpSource, OpenAISDKSource
from polygate_celery.sources.exchange import MAX_BODY_BYTES
from polygate_celery.sources.sdk_http import bounded_http_client
from tests.conftest import CANARY_KEY
from tests.integration.sources.rawserver import RawServer, response

ADAPTERS = ("http", "sdk")
CHAT = ChatRequest([{"role": "user", "content": "hi"}], stream=False)
STREAM = ChatRequest([{"role": "user", "content": "hi"}], stream=True)
PADDING = "a" * 800_000  # 800 KB: 65 s of punycode decoding before
COMPLETION = {"model": "m", "choices": [{"index": 0, "message": {"content": "café"}}]}
PUNYCODE_JSON = "application/json; charset=punycode"
QUICK_S = 2.0  # generous on a busy machine; the old decoding took 18 s for 500 KB


def padded_completion() -> str:
    return json.dumps({**COMPLETION, "padding": PADDING})


def sse(chunks: list[bytes], content_type: str = "text/event-stream") -> bytes:
    body = b"".join(b"data: " + c + b"\n\n" for c in chunks)
    return response(200, body, content_type=content_type)


def delta(text: bytes, finish: str | None = None) -> bytes:
    finish_json = json.dumps(finish).encode()
    return (
        b'{"model":"m","choices":[{"index":0,"delta":{"content":"'
        + text
        + b'"},"finish_reason":'
        + finish_json
        + b"}]}"
    )


@pytest.fixture(params=ADAPTERS)
async def ask(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Sends one request to a raw server answering `answer`, timing the loop's longest stall."""
    clients: list[Any] = []

    async def send(answer: bytes, payload: ChatRequest = CHAT) -> tuple[Outcome, float, float]:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(answer)
            await writer.drain()

        async with RawServer(write) as server:
            source: Any
            if request.param == "http":
                client: Any = httpx.AsyncClient()
                source = OpenAIHttpSource(
                    base_url=server.url, model="m", api_key=SecretStr(CANARY_KEY), client=client
                )
            else:
                client = openai.AsyncOpenAI(
                    base_url=server.url,
                    api_key=CANARY_KEY,
                    http_client=bounded_http_client(MAX_BODY_BYTES),
                )
                source = OpenAISDKSource(client, model="m")
            clients.append(client)
            longest = 0.0

            async def tick() -> None:
                nonlocal longest
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.005)
                    longest = max(longest, time.monotonic() - last)
                    last = time.monotonic()

            ticker = asyncio.get_running_loop().create_task(tick())
            started = time.monotonic()
            outcome = await source.send(payload, timeout_s=60)
            elapsed = time.monotonic() - started
            ticker.cancel()
        return outcome, elapsed, longest

    yield send
    for client in clients:
        await client.aclose() if isinstance(client, httpx.AsyncClient) else await client.close()


def assert_malformed(outcome: Outcome, reason: str) -> None:
    assert (outcome.kind, outcome.status, outcome.reason) == (OutcomeKind.TRANSIENT, 200, reason)
    assert outcome.value is None


@pytest.mark.parametrize("charset", ["punycode", "utf-16", "latin-1", "utf-7"])
async def test_a_body_in_another_charset_is_malformed_at_once(ask: Any, charset: str) -> None:
    answer = response(200, padded_completion(), content_type=f"application/json; charset={charset}")
    outcome, elapsed, stall = await ask(answer)
    assert_malformed(outcome, f"malformed answer: charset '{charset}' (only UTF-8 is read)")
    assert elapsed < QUICK_S
    assert stall < QUICK_S


async def test_a_stream_in_another_charset_is_malformed_at_once(ask: Any) -> None:
    answer = sse([delta(b"x" * 800_000, "stop")], "text/event-stream; charset=punycode")
    outcome, elapsed, _ = await ask(answer, STREAM)
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.TRANSIENT,
        "malformed stream: charset 'punycode' (only UTF-8 is read)",
    )
    assert elapsed < QUICK_S


@pytest.mark.parametrize(
    "charset", ["utf-8", "UTF-8", "utf8", '"utf-8"', "us-ascii", "ascii", "utf-8-sig"]
)
async def test_a_body_in_utf8_or_its_kin_is_read(ask: Any, charset: str) -> None:
    body = json.dumps(COMPLETION, ensure_ascii=charset.endswith("ascii")).encode()
    if charset == "utf-8-sig":
        body = b"\xef\xbb\xbf" + body
    outcome, _, _ = await ask(
        response(200, body, content_type=f"application/json; charset={charset}")
    )
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.value.text == "café"


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","choices":[{"index":0,"message":{"content":"caf\xe9"}}]}',  # latin-1
        b'{"model":"m","choices":[{"index":0,"message":{"content":"\xed\xa0\x80"}}]}',  # surrogate
        b'{"model":"m","choices":[{"index":0,"message":{"content":"\xf0\x9f"}}]}',  # cut short
    ],
    ids=["latin-1-byte", "encoded-surrogate", "truncated-sequence"],
)
async def test_invalid_utf8_in_a_body_is_malformed(ask: Any, body: bytes) -> None:
    outcome, _, _ = await ask(response(200, body))
    assert_malformed(outcome, "malformed answer: not valid UTF-8")


async def test_invalid_utf8_in_a_stream_is_malformed(ask: Any) -> None:
    answer = sse([delta(b"caf"), delta(b"\xe9"), delta(b"!", "stop")])
    outcome, _, _ = await ask(answer, STREAM)
    assert (outcome.kind, outcome.reason) == (
        OutcomeKind.TRANSIENT,
        "malformed stream: not valid UTF-8",
    )
    assert outcome.value is None


@pytest.mark.parametrize("padded", [False, True])
async def test_an_error_answer_in_punycode_is_read_as_utf8_at_once(ask: Any, padded: bool) -> None:
    error: dict[str, Any] = {"error": {"message": "overloaded, café"}}
    if padded:  # past the 64 KiB of an error body kept for its reason
        error["padding"] = PADDING
    answer = response(500, json.dumps(error, ensure_ascii=False), content_type=PUNYCODE_JSON)
    outcome, elapsed, stall = await ask(answer)
    reason = "HTTP 500" if padded else "overloaded, café"
    assert (outcome.kind, outcome.status, outcome.reason) == (OutcomeKind.TRANSIENT, 500, reason)
    assert elapsed < QUICK_S
    assert stall < QUICK_S
