"""Reading an answer within a byte limit: whole bodies and event-stream lines, without a network."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polygate_celery.sources.body import BodyTooLarge, LineSplitter, read_text, sse_lines


class Chunks:
    """An answer whose body arrives in the given pieces, counting what was taken."""

    status_code = 200
    encoding = None

    def __init__(self, *chunks: bytes, headers: dict[str, str] | None = None) -> None:
        self.chunks = chunks
        self.headers = headers or {}
        self.taken = 0

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.taken += len(chunk)
            yield chunk


def lines_of(*chunks: bytes, limit: int = 1000) -> list[str]:
    async def collect() -> list[str]:
        return [line async for line in sse_lines(Chunks(*chunks), limit)]

    return asyncio.run(collect())


def test_lines_end_at_lf_crlf_or_cr_even_split_between_reads() -> None:
    assert lines_of(b"a\nb\r\nc\rd") == ["a", "b", "c", "d"]
    assert lines_of(b"a\r", b"\nb\r", b"", b"\nc") == ["a", "b", "c"]
    assert lines_of(b"a\r", b"\r\n", b"\nb") == ["a", "", "", "b"]
    assert lines_of(b"da", b"ta: x", b"\n\n") == ["data: x", ""]


def test_a_stream_without_a_break_is_refused_at_the_limit() -> None:
    answer = Chunks(*[b"x" * 100] * 1000)

    async def drain() -> None:
        async for _ in sse_lines(answer, 1000):
            pass

    with pytest.raises(BodyTooLarge):
        asyncio.run(drain())
    assert answer.taken <= 1100


def test_a_body_past_its_limit_is_refused_as_it_arrives() -> None:
    answer = Chunks(*[b"x" * 100] * 1000)
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_text(answer, 1000))
    assert answer.taken <= 1100


def test_a_body_announced_too_long_is_refused_unread() -> None:
    answer = Chunks(b"x", headers={"content-length": "1001"})
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_text(answer, 1000))
    assert answer.taken == 0


def test_a_body_within_its_limit_is_read_whole() -> None:
    assert asyncio.run(read_text(Chunks(b"caf", "é".encode()), 5)) == "café"


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    text=st.text(alphabet="ab\r\né", max_size=60),
    cuts=st.lists(st.integers(0, 80), max_size=8),
)
def test_any_cut_of_a_stream_gives_its_lines(text: str, cuts: list[int]) -> None:
    data = text.encode()
    edges = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    chunks = [data[a:b] for a, b in itertools.pairwise(edges)]
    splitter = LineSplitter(len(data))
    got = [line for chunk in chunks for line in splitter.feed(chunk)] + splitter.finish()
    expected = re.split(r"\r\n|\r|\n", text)
    if expected and expected[-1] == "":
        expected.pop()  # the break after the last line ends it
    assert got == expected
