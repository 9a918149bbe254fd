"""Source layer: what a 2xx answer's body holds, read into a success or refused as malformed.

Both OpenAI-style adapters read the same JSON here, so a completion, an
embedding list or an OCR answer is judged the same whichever way it came.
"""

from __future__ import annotations

import array
import base64
import binascii
import json
import math
import sys
from typing import Any

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.payloads import ChatResult, EmbeddingResult, OcrResult
from polygate_celery.sources.stream import count

_UNREADABLE = (ValueError, KeyError, IndexError, TypeError, RecursionError)


class MalformedAnswer(Exception):
    """A 2xx body that is not the answer asked for; `what` names what it should have been."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def completion(text: str) -> Outcome:
    """A chat completion's body: the answer, a withheld answer (fatal), or malformed."""
    try:
        data = json.loads(text)
        choice = data["choices"][0]
        message = choice["message"]
        finish = choice.get("finish_reason")
        result = chat_result(message, finish)
    except _UNREADABLE:
        raise MalformedAnswer("chat completion") from None
    if result is None:
        if finish == "content_filter":
            return Outcome.fatal("the provider's content filter withheld the answer", status=200)
        raise MalformedAnswer("chat completion (no answer in it)")
    return success(result, data)


def embeddings(text: str, expected: int) -> Outcome:
    try:
        data = json.loads(text)
        vectors = embedding_vectors(data["data"], expected)
    except _UNREADABLE:
        raise MalformedAnswer("embeddings") from None
    return success(EmbeddingResult(vectors), data)


def ocr(text: str) -> Outcome:
    """A JSON OCR endpoint's body: ``{"text": ...}``."""
    try:
        data = json.loads(text)
        answer = data["text"]
        if not isinstance(answer, str):
            raise TypeError("no text")
    except _UNREADABLE:
        raise MalformedAnswer("OCR answer") from None
    return success(OcrResult(answer), data)


def chat_result(message: Any, finish: Any) -> ChatResult | None:
    """The answer in a completion's message, or None if it holds none."""
    if not isinstance(message, dict):
        raise TypeError("message is not an object")
    text = message.get("content")
    tools = message.get("tool_calls")
    refusal = message.get("refusal")
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    has_tools = isinstance(tools, list) and bool(tools)
    if not isinstance(text, str) and not has_tools and not isinstance(refusal, str):
        return None
    return ChatResult(
        text if isinstance(text, str) else "",
        finish if isinstance(finish, str) else None,
        tool_calls=[t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else [],
        reasoning=reasoning if isinstance(reasoning, str) else None,
        refusal=refusal if isinstance(refusal, str) else None,
    )


def embedding_vectors(items: Any, expected: int) -> list[list[float]]:
    """One finite, same-length vector per input, in input order; ValueError otherwise.

    A vector is a list of numbers or, as the openai SDK asks for by default,
    base64 of little-endian float32s.
    """
    if not isinstance(items, list) or len(items) != expected:
        raise ValueError("one vector per input")
    by_index: dict[int, list[float]] = {}
    for position, item in enumerate(items):
        index = item.get("index", position) if isinstance(item, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < expected:
            raise ValueError("a vector with a bad index")
        if index in by_index:
            raise ValueError("two vectors for one input")
        vector = _vector(item["embedding"])
        if not vector or not all(math.isfinite(x) for x in vector):
            raise ValueError("an empty or non-finite vector")
        by_index[index] = vector
    vectors = [by_index[i] for i in range(expected)]
    if len({len(v) for v in vectors}) > 1:
        raise ValueError("vectors of different lengths")
    return vectors


def _vector(value: Any) -> list[float]:
    if not isinstance(value, str):
        return [float(x) for x in value]
    try:
        packed = base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError("a vector that is not base64") from None
    if len(packed) % 4:
        raise ValueError("a base64 vector that is not float32s")
    floats = array.array("f", packed)
    if sys.byteorder == "big":
        floats.byteswap()
    return floats.tolist()


def success(value: Any, data: Any) -> Outcome:
    """A success with the model and usage the body names, where it names them."""
    usage = data.get("usage") if isinstance(data, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    model = data.get("model") if isinstance(data, dict) else None
    return Outcome.success(
        value,
        status=200,
        model=model if isinstance(model, str) else None,
        prompt_tokens=count(usage.get("prompt_tokens")),
        completion_tokens=count(usage.get("completion_tokens")),
    )
