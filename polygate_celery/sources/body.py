"""Source layer: reading a provider's answer within a byte limit, whole or line by line.

A hostile or broken provider can send an endless body, or an event stream with
no line break in it; nothing here holds more than `limit` bytes of one answer
(counted after content decoding), so the worst an answer can cost is the limit,
and it ends as `BodyTooLarge`. A 2xx body's JSON is decoded as it arrives by
`polygate_celery.sources.decode`; what is read here whole is an error body,
of which only the start is kept. Stream lines are split here, on the bytes, rather
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


ERROR_TEXT_BYTES = 64 * 1024


async def read_text(answer: Answer, limit: int, keep: int = ERROR_TEXT_BYTES) -> str:
    """The start of an error answer's body as text, the whole read within `limit` bytes.

    An error body only feeds a reason, so its first `keep` bytes are kept and
    the rest is counted and dropped; they are read as UTF-8 whatever the
    answer declares (a few of Python's codecs take quadratic time), with
    replacement characters for what is not.
    """
    if announced_too_large(answer.headers, limit):
        raise BodyTooLarge(limit, answer.headers)
    kept = bytearray()
    size = 0
    async for chunk in answer.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, answer.headers)
        if len(kept) < keep:
            kept += chunk[: keep - len(kept)]
    return kept.decode("utf-8", errors="replace")


class LineTooLong(ValueError):
    """An event-stream line longer than a stream's chunk could ever be."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a line longer than {limit // 2**20} MiB")


MAX_LINE_BYTES = 8 * 1024 * 1024
_BREAK = re.compile(rb"\r\n|\r|\n")


class LineSplitter:
    """Splits an event stream's bytes into lines (LF, CRLF or CR), `limit` bytes in all.

    An event stream is UTF-8 (the SSE standard knows no other): a line that is
    not raises `UnicodeDecodeError`, never read with replacement characters.

    Only the new bytes are scanned for a break, so a long line costs its length
    once; its pieces wait in a buffer that can never outgrow the limit. A line
    longer than `max_line` bytes raises `LineTooLong`: a stream's chunk carries
    a few tokens, and one line is decoded (and copied) whole.
    """

    def __init__(self, limit: int, max_line: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self.max_line = max_line
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
            self._check(self._tail)
            return []
        lines = [bytes(self._tail) + parts[0], *parts[1:-1]]
        self._tail = bytearray(parts[-1])
        for line in (*lines, self._tail):
            self._check(line)
        return [line.decode("utf-8") for line in lines]

    def _check(self, line: bytes | bytearray) -> None:
        if len(line) > self.max_line:
            raise LineTooLong(self.max_line)

    def finish(self) -> list[str]:
        """The last line, if the stream ended without a break after it."""
        tail, self._tail = bytes(self._tail), bytearray()
        return [tail.decode("utf-8")] if tail else []


async def sse_lines(answer: Answer, limit: int) -> AsyncGenerator[str, None]:
    """The answer's event-stream lines, refusing a stream longer than `limit` bytes."""
    splitter = LineSplitter(limit)
    async for chunk in answer.aiter_bytes():
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.finish():
        yield line
