"""A bare HTTP server for provider quirks: each connection gets what a script writes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    def __init__(self, respond: Writer) -> None:
        self.respond = respond
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            await reader.readexactly(length)
            await self.respond(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def response(
    status: int, body: bytes | str, content_type: str = "application/json", extra: str = ""
) -> bytes:
    data = body.encode() if isinstance(body, str) else body
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(data)}\r\n{extra}connection: close\r\n\r\n"
    ).encode() + data


def fixed(status: int, body: Any, **kwargs: Any) -> Writer:
    payload = body if isinstance(body, (bytes, str)) else json.dumps(body)

    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(response(status, payload, **kwargs))
        await writer.drain()

    return write


def sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + json.dumps({"model": "raw", "choices": choices, **extra}).encode() + b"\n\n"
