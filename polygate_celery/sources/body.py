"""Source layer: reading a provider's answer within a byte limit, whole or line by line.

A hostile or broken provider can send an endless body, or an event stream with
no line break in it; nothing here holds more than `limit` bytes of one answer
(counted after content decoding), so the worst an answer can cost is the limit,
and it ends as `BodyTooLarge`. Stream lines are split here, on the bytes, rather
than by the HTTP library, whose line reader buffers an unterminated line whole.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Protocol


class Answer(Protocol):
    """The part of an HTTP response the adapters read (httpx's and httpx2's both fit)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def encoding(self) -> str | None: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


class BodyTooLarge(Exception):
    """An answer longer than the limit; `headers` are its headers when known."""

    def __init__(self, limit: int, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"an answer larger than {limit} bytes")
        self.headers = headers


def announced_too_large(headers: Mapping[str, str], limit: int) -> bool:
    """The answer says in its Content-Length that it is longer than `limit`."""
    length = headers.get("content-length")
    return length is not None and length.isdigit() and int(length) > limit


async def read_bytes(answer: Answer, limit: int) -> bytes:
    """The whole body, refused as soon as it passes `limit` bytes."""
    if announced_too_large(answer.headers, limit):
        raise BodyTooLarge(limit, answer.headers)
    chunks: list[bytes] = []
    size = 0
    async for chunk in answer.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, answer.headers)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_text(answer: Answer, limit: int) -> str:
    """The whole body as text (its charset, else UTF-8), within `limit` bytes."""
    data = await read_bytes(answer, limit)
    return data.decode(answer.encoding or "utf-8", errors="replace")


_BREAK = re.compile(rb"\r\n|\r|\n")


class LineSplitter:
    """Splits an event stream's bytes into lines (LF, CRLF or CR), `limit` bytes in all.

    Only the new bytes are scanned for a break, so a long line costs its length
    once; its pieces wait in a buffer that can never outgrow the limit.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._tail = bytearray()
        self._after_cr = False

    def feed(self, data: bytes) -> list[str]:
        if not data:
            return []
        self.size += len(data)
        if self.size > self.limit:
            raise BodyTooLarge(self.limit)
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]  # the LF of a CRLF split between two reads
        self._after_cr = data.endswith(b"\r")
        parts = _BREAK.split(data)
        if len(parts) == 1:
            self._tail += data
            return []
        lines = [bytes(self._tail) + parts[0], *parts[1:-1]]
        self._tail = bytearray(parts[-1])
        return [line.decode("utf-8", errors="replace") for line in lines]

    def finish(self) -> list[str]:
        """The last line, if the stream ended without a break after it."""
        tail, self._tail = bytes(self._tail), bytearray()
        return [tail.decode("utf-8", errors="replace")] if tail else []


async def sse_lines(answer: Answer, limit: int) -> AsyncGenerator[str, None]:
    """The answer's event-stream lines, refusing a stream longer than `limit` bytes."""
    splitter = LineSplitter(limit)
    async for chunk in answer.aiter_bytes():
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.finish():
        yield line
