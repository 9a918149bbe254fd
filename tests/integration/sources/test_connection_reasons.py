"""A broken connection's reason says how far the answer got, in one wording for both adapters."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from polygate_celery.core.outcome import OutcomeKind
from polygate_celery.sources import ChatRequest
from tests.integration.sources.conftest import SourceFactory
from tests.integration.sources.rawserver import RawServer, Writer, chunk, sse_head
from tests.redis_server import free_port

HELLO = ChatRequest([{"role": "user", "content": "hi"}])


def reset(writer: asyncio.StreamWriter) -> None:
    """End the connection with a TCP reset instead of a close."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def then_end(data: bytes, *, with_reset: bool) -> Writer:
    async def write(writer: asyncio.StreamWriter) -> None:
        if data:
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(0.05)
        if with_reset:
            reset(writer)

    return write


async def reason(
    make_source: SourceFactory, respond: Writer, *, stream: bool
) -> tuple[OutcomeKind, str | None]:
    async with RawServer(respond) as server:
        source = make_source("raw", url=server.url, stream=stream, stream_usage=False)
        outcome = await source.send(HELLO, timeout_s=5.0)
    assert not outcome.timed_out
    return outcome.kind, outcome.reason


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refused_connection_says_so(make_source: SourceFactory, stream: bool) -> None:
    source = make_source("raw", url=f"http://127.0.0.1:{free_port()}/v1", stream=stream)
    outcome = await source.send(HELLO, timeout_s=5.0)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.TRANSIENT, "connection refused")


@pytest.mark.parametrize("with_reset", [False, True])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_connection_ended_before_any_answer_byte_says_so(
    make_source: SourceFactory, stream: bool, with_reset: bool
) -> None:
    said = await reason(make_source, then_end(b"", with_reset=with_reset), stream=stream)
    assert said == (OutcomeKind.TRANSIENT, "connection closed before any answer byte")


@pytest.mark.parametrize("with_reset", [False, True])
async def test_a_stream_cut_after_some_chunks_says_so(
    make_source: SourceFactory, with_reset: bool
) -> None:
    parts = sse_head() + chunk({"content": "Hel"}) + chunk({"content": "lo"})
    said = await reason(make_source, then_end(parts, with_reset=with_reset), stream=True)
    assert said == (OutcomeKind.TRANSIENT, "stream cut before its final chunk")


@pytest.mark.parametrize("with_reset", [False, True])
async def test_a_stream_that_ends_before_its_first_chunk_says_so(
    make_source: SourceFactory, with_reset: bool
) -> None:
    parts = sse_head() + b": keep-alive\n\n"
    said = await reason(make_source, then_end(parts, with_reset=with_reset), stream=True)
    assert said == (OutcomeKind.TRANSIENT, "stream closed before its first chunk")


@pytest.mark.parametrize("with_reset", [False, True])
@pytest.mark.parametrize("status", [200, 500])
async def test_an_answer_cut_mid_body_says_so(
    make_source: SourceFactory, with_reset: bool, status: int
) -> None:
    head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n"
    cut = then_end(head.encode() + b'{"choices": [', with_reset=with_reset)
    for stream in (False, True):
        said = await reason(make_source, cut, stream=stream)
        assert said == (OutcomeKind.TRANSIENT, "connection closed mid-answer")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_429_whose_body_is_cut_is_still_rate_limited(
    make_source: SourceFactory, stream: bool
) -> None:
    head = b"HTTP/1.1 429 X\r\nretry-after: 4\r\ncontent-length: 500\r\n\r\n"
    said = await reason(make_source, then_end(head + b'{"err', with_reset=True), stream=stream)
    assert said == (OutcomeKind.RATE_LIMITED, "rate limited")
