"""Assembling a streamed answer: whole at its final chunk, never from a broken stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polygate_celery.sources import ChatResult
from polygate_celery.sources.stream import MalformedChunk, StreamAssembly


def data(choices: list[dict[str, Any]], **extra: Any) -> str:
    return "data: " + json.dumps({"model": "m-1", "choices": choices, **extra})


def delta(text: str) -> str:
    return data([{"index": 0, "delta": {"content": text}, "finish_reason": None}])


FINAL = data([{"index": 0, "delta": {}, "finish_reason": "stop"}])
USAGE = data([], usage={"prompt_tokens": 5, "completion_tokens": 2})


def test_the_final_chunk_completes_the_answer_without_done() -> None:
    assembly = StreamAssembly(want_usage=False)
    for line in [
        data([{"index": 0, "delta": {"role": "assistant"}}]),
        "",
        delta("Hel"),
        delta("lo"),
        FINAL,
    ]:
        assembly.feed(line)
    assert assembly.done
    outcome = assembly.outcome()
    assert outcome.value == ChatResult("Hello", "stop")
    assert outcome.model == "m-1"


def test_with_usage_asked_for_the_usage_chunk_is_the_last() -> None:
    assembly = StreamAssembly(want_usage=True)
    for line in [delta("Hi"), FINAL]:
        assembly.feed(line)
    assert assembly.whole
    assert not assembly.done
    assembly.feed(USAGE)
    assert assembly.done
    assert (assembly.outcome().prompt_tokens, assembly.outcome().completion_tokens) == (5, 2)


def test_the_first_token_is_the_first_content() -> None:
    assembly = StreamAssembly(want_usage=False)
    assembly.feed(data([{"index": 0, "delta": {"role": "assistant"}}]))
    assert not assembly.first_token
    assembly.feed(delta("x"))
    assert assembly.first_token


@pytest.mark.parametrize("line", ["data: {not json", "data: [1, 2]", 'data: {"model": "m"}'])
def test_a_malformed_chunk_is_refused(line: str) -> None:
    with pytest.raises(MalformedChunk):
        StreamAssembly(want_usage=False).feed(line)


def test_done_before_the_final_chunk_is_a_cut_stream() -> None:
    assembly = StreamAssembly(want_usage=False)
    assembly.feed(delta("partial"))
    with pytest.raises(MalformedChunk):
        assembly.feed("data: [DONE]")
    assert not assembly.whole


def test_comments_and_event_lines_are_ignored() -> None:
    assembly = StreamAssembly(want_usage=False)
    for line in [": keep-alive", "event: message", "", delta("a"), FINAL]:
        assembly.feed(line)
    assert assembly.outcome().value == ChatResult("a", "stop")


def test_an_error_object_mid_stream_is_recorded() -> None:
    assembly = StreamAssembly(want_usage=False)
    assembly.feed('data: {"error": {"message": "overloaded"}}')
    assert assembly.error == {"message": "overloaded"}
