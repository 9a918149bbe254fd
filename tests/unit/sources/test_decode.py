"""Decoding a provider's JSON as it arrives: charsets, UTF-8, the budget, depth and token limits.

No network: an answer here is a list of byte chunks. The memory and loop-stall
figures of whole calls are measured in tests/integration/sources/test_hostile_decoding.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from polygate_celery.sources.body import BodyTooLarge, LineSplitter, read_text
from polygate_celery.sources.decode import (
    MAX_DEPTH,
    MAX_TOKEN_BYTES,
    Budget,
    Undecodable,
    charset,
    check_charset,
    discard,
    loads,
    read_json,
)

LIMIT = 64 * 1024 * 1024


class Chunks:
    """A 200 answer whose body arrives in the given pieces."""

    status_code = 200
    encoding = None

    def __init__(self, *chunks: bytes, content_type: str = "application/json") -> None:
        self.chunks = chunks
        self.headers = {"content-type": content_type}

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def pieces(data: bytes, size: int = 7) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def decode(*chunks: bytes, budget: int = LIMIT, content_type: str = "application/json") -> Any:
    answer = Chunks(*chunks, content_type=content_type)
    return asyncio.run(read_json(answer, LIMIT, Budget(budget)))[0]


def why(*chunks: bytes, **options: Any) -> str:
    with pytest.raises(Undecodable) as caught:
        decode(*chunks, **options)
    return caught.value.why


DOCUMENT = {
    "model": "m",
    "choices": [{"index": 0, "message": {"content": "café ☕ 𝄞", "tool_calls": []}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 12},
    "numbers": [0, -1, 2**62, 1.5, -2.5e-8, 1e300],
    "flags": [True, False, None, ""],
    "nested": {"a": {"b": [[], {}, [[{"c": "d"}]]]}},
}


def test_a_document_split_anywhere_decodes_as_json_loads_does() -> None:
    data = json.dumps(DOCUMENT, ensure_ascii=False).encode()
    for size in (1, 2, 3, 7, 64, len(data)):
        assert decode(*pieces(data, size)) == DOCUMENT


@pytest.mark.parametrize(
    ("header", "found"),
    [
        ("application/json", None),
        ("application/json; charset=UTF-8", "utf-8"),
        ('application/json;charset="utf8"', "utf8"),
        ("text/event-stream; foo=bar; Charset = Punycode ", "punycode"),
    ],
)
def test_the_charset_is_read_from_the_content_type(header: str, found: str | None) -> None:
    assert charset({"content-type": header}) == found


@pytest.mark.parametrize("name", ["utf-8", "UTF8", "utf_8", "utf-8-sig", "us-ascii", "ASCII"])
def test_utf8_and_its_kin_are_accepted(name: str) -> None:
    check_charset({"content-type": f"application/json; charset={name}"})


@pytest.mark.parametrize("name", ["punycode", "utf-16", "latin-1", "iso-8859-1", "cp1252", "x"])
def test_any_other_charset_is_refused_unread(name: str) -> None:
    started = time.process_time()
    assert why(b"{}" * 1000, content_type=f"application/json; charset={name}") == (
        f"charset '{name}' (only UTF-8 is read)"
    )
    assert time.process_time() - started < 0.5


def test_a_bom_is_skipped() -> None:
    assert decode(b"\xef\xbb", b'\xbf{"a": 1}') == {"a": 1}


@pytest.mark.parametrize(
    "chunks",
    [(b'["caf\xe9"]',), (b'["\xc3', b'\x28"]'), (b'["\xed\xa0\x80"]',), (b'["\xf0\x9f\x98"]',)],
)
def test_bytes_that_are_not_utf8_are_refused_never_replaced(chunks: tuple[bytes, ...]) -> None:
    assert why(*chunks) == "not valid UTF-8"


@pytest.mark.parametrize(
    "body", [b"", b"{", b"[1,]", b"{} {}", b"NaN", b"[Infinity]", b"[1e999]", b"'a'"]
)
def test_what_is_not_one_json_value_is_refused(body: bytes) -> None:
    assert why(body) in {"not JSON", "empty"}


def test_a_body_that_would_cost_more_than_its_budget_is_refused_as_it_is_built() -> None:
    body = b"[" + b",".join([b"{}"] * 100_000) + b"]"
    assert decode(body, budget=200_000_000) == [{}] * 100_000
    assert why(body, budget=1_000_000) == "would take more than 0 MiB to decode"


def test_what_is_charged_is_at_least_what_the_objects_take() -> None:
    bodies = {
        "floats": json.dumps([i / 7 for i in range(50_000)]),
        "ints": json.dumps({"a": list(range(50_000))}),
        "strings": json.dumps([str(i) * 3 for i in range(20_000)]),
        "dicts": json.dumps([{"k": i, "v": [i]} for i in range(10_000)]),
        "lists": json.dumps([[], [[]]] * 10_000),
        "constants": json.dumps([None, True, False] * 10_000),
    }
    for name, body in bodies.items():
        budget = Budget(LIMIT)
        value = asyncio.run(read_json(Chunks(body.encode()), LIMIT, budget))[0]
        charged = LIMIT - budget.left
        assert charged >= deep_size(value), name
        assert charged <= 8 * deep_size(value) + 1_000_000, name


def deep_size(value: Any) -> int:
    if isinstance(value, list):
        return sys.getsizeof(value) + sum(deep_size(v) for v in value)
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(deep_size(k) + deep_size(v) for k, v in value.items())
    return 0 if value is None or isinstance(value, bool) else sys.getsizeof(value)


def test_nesting_past_the_limit_is_refused() -> None:
    assert decode(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    assert why(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)) == (
        f"nested deeper than {MAX_DEPTH}"
    )


def test_a_token_longer_than_the_limit_is_refused() -> None:
    text = b"x" * (MAX_TOKEN_BYTES - 100)
    assert decode(*pieces(b'["' + text + b'"]', 16 * 1024)) == [text.decode()]
    # counted from the parser's last event, which may be up to one slice before the token
    long = b'["' + b"x" * (MAX_TOKEN_BYTES + 16 * 1024) + b'"]'
    assert why(*pieces(long, 16 * 1024)) == "a single value longer than 4 MiB"


def test_a_long_string_costs_its_length_not_its_length_squared() -> None:
    text = b"x" * (MAX_TOKEN_BYTES - 100)

    def cpu_s(piece: int) -> float:
        started = time.process_time()
        decode(*pieces(b'["' + text + b'"]', piece))
        return time.process_time() - started

    # fed 1 KiB at a time, a parser that scanned the token again at every
    # piece would scan it 4,096 times (about 8 GB); held until it doubles, 2 x.
    assert cpu_s(1024) < 20 * max(cpu_s(len(text) + 4), 0.01)


def test_a_body_past_the_limit_is_refused() -> None:
    answer = Chunks(b"[" + b"0," * 100, b"0]")
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_json(answer, 100, Budget(LIMIT)))


def test_a_refused_body_keeps_its_start_for_the_excerpt() -> None:
    answer = Chunks(b'{"a": [1, 2', b", oops]}")
    with pytest.raises(Undecodable) as caught:
        asyncio.run(read_json(answer, LIMIT, Budget(LIMIT)))
    assert caught.value.excerpt == '{"a": [1, 2, oops]}'


def test_an_event_stream_chunk_is_decoded_within_the_budget() -> None:
    assert asyncio.run(loads('{"a": [1, 2.5]}', Budget(LIMIT))) == {"a": [1, 2.5]}
    with pytest.raises(Undecodable, match="not JSON"):
        asyncio.run(loads('{"a": NaN}', Budget(LIMIT)))
    large = "[" + ",".join(["{}"] * 100_000) + "]"
    assert asyncio.run(loads(large, Budget(LIMIT))) == [{}] * 100_000
    with pytest.raises(Undecodable, match="would take more than"):
        asyncio.run(loads(large, Budget(1_000_000)))


def test_discard_takes_apart_what_nothing_else_holds_and_keeps_what_a_result_does() -> None:
    kept = [1.0, 2.0]
    leaf = float("1.25")  # a float of its own, to see when the junk lets go of it
    value = {"result": kept, "junk": [[{}] * 3, [leaf] * 1000, list(range(200_000))]}
    assert sys.getrefcount(leaf) == 1002
    box = [value]
    del value
    asyncio.run(discard(box, keep_shared=True))
    assert box == []
    assert kept == [1.0, 2.0]
    assert sys.getrefcount(leaf) == 2


def test_discard_gives_the_loop_turns_while_it_lets_go_of_much() -> None:
    turns = 0

    async def main() -> None:
        nonlocal turns

        async def count() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        counter = asyncio.get_running_loop().create_task(count())
        await asyncio.sleep(0)
        await discard([[[0] * 10 for _ in range(100_000)], list(range(1_000_000))])
        counter.cancel()

    asyncio.run(main())
    assert turns >= 10


def test_an_error_body_keeps_its_start_and_is_read_as_utf8_whatever_it_declares() -> None:
    answer = Chunks("é".encode() * 50_000, content_type="application/json; charset=punycode")
    text = asyncio.run(read_text(answer, LIMIT, keep=10))
    assert text == "é" * 5
    assert asyncio.run(read_text(Chunks(b"caf\xe9"), LIMIT)) == "caf\ufffd"


def test_an_event_stream_line_that_is_not_utf8_is_refused() -> None:
    splitter = LineSplitter(1000)
    assert splitter.feed(b"data: caf\xc3") == []
    assert splitter.feed(b"\xa9\n") == ["data: café"]
    with pytest.raises(UnicodeDecodeError):
        splitter.feed(b"data: caf\xe9\n")
    splitter = LineSplitter(1000)
    splitter.feed(b"data: \xe9")
    with pytest.raises(UnicodeDecodeError):
        splitter.finish()
