"""Source layer: what a 2xx answer's body holds, read into a success or refused as malformed.

Both OpenAI-style adapters read the same JSON here (decoded by
`polygate_celery.sources.decode`), so a completion, an embedding list or an OCR
answer is judged the same whichever way it came. Embeddings are the one answer
whose reading costs in proportion to its size (base64 vectors become Python
floats, six times their text), so they are read within the answer's decoding
budget, a slice at a time.
"""

from __future__ import annotations

import array
import asyncio
import base64
import binascii
import math
import sys
from typing import Any

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.decode import STEP, Budget
from polygate_celery.sources.payloads import ChatResult, EmbeddingResult, OcrResult
from polygate_celery.sources.stream import count

_UNREADABLE = (ValueError, KeyError, IndexError, TypeError, RecursionError)
_FLOATS = frozenset({float})
_FLOAT_COST = 33  # a float (24 bytes) and its place in a list, grown by an eighth


class MalformedAnswer(Exception):
    """A 2xx body that is not the answer asked for; `what` names what it should have been."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


async def completion(data: Any, budget: Budget) -> Outcome:
    """A chat completion's body: the answer, a withheld answer (fatal), or malformed."""
    try:
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


async def embeddings(data: Any, budget: Budget, expected: int) -> Outcome:
    try:
        vectors = await embedding_vectors(data["data"], expected, budget)
    except _UNREADABLE:
        raise MalformedAnswer("embeddings") from None
    return success(EmbeddingResult(vectors), data)


async def ocr(data: Any, budget: Budget) -> Outcome:
    """A JSON OCR endpoint's body: ``{"text": ...}``."""
    try:
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


async def embedding_vectors(items: Any, expected: int, budget: Budget) -> list[list[float]]:
    """One finite, same-length vector per input, in input order; ValueError otherwise.

    A vector is a list of numbers or, as the openai SDK asks for by default,
    base64 of little-endian float32s. A list of floats is kept as it was
    decoded; a vector that has to be made (from base64, or from other numbers)
    is charged to `budget`, and a base64 text it replaces is given back.
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
        value = item["embedding"]
        vector = await _vector(value, budget)
        if vector is not value and isinstance(value, str):
            item["embedding"] = vector
            budget.refund(sys.getsizeof(value))
        del value
        if not vector:
            raise ValueError("an empty vector")
        by_index[index] = vector
        await asyncio.sleep(0)
    vectors = [by_index[i] for i in range(expected)]
    if len({len(v) for v in vectors}) > 1:
        raise ValueError("vectors of different lengths")
    return vectors


async def _vector(value: Any, budget: Budget) -> list[float]:
    if isinstance(value, str):
        return await _unpacked(value, budget)
    if not isinstance(value, list):
        raise TypeError("a vector that is not a list")
    starts = range(0, len(value), STEP)
    for start in starts:
        if not set(map(type, value[start : start + STEP])) <= _FLOATS:
            break
        await asyncio.sleep(0)
    else:
        return value  # floats as decoded: finite, as the decoder refuses an overflow
    budget.charge(_FLOAT_COST * len(value))
    vector: list[float] = []
    for start in starts:
        floats = list(map(float, value[start : start + STEP]))
        if not all(map(math.isfinite, floats)):
            raise ValueError("a non-finite vector")
        vector += floats
        await asyncio.sleep(0)
    return vector


async def _unpacked(value: str, budget: Budget) -> list[float]:
    try:
        packed = base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError("a vector that is not base64") from None
    if len(packed) % 4:
        raise ValueError("a base64 vector that is not float32s")
    budget.charge(_FLOAT_COST * (len(packed) // 4))
    floats = array.array("f", packed)
    del packed
    if sys.byteorder == "big":
        floats.byteswap()
    vector: list[float] = []
    for start in range(0, len(floats), STEP):
        piece = floats[start : start + STEP].tolist()
        if not all(map(math.isfinite, piece)):
            raise ValueError("a non-finite vector")
        vector += piece
        await asyncio.sleep(0)
    return vector


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
