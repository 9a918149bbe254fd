"""Testing: the bodies the simulator sends — OpenAI-shaped answers, chunks and errors.

Pure functions of their arguments, so the shapes can be read in one place.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any

from polygate_celery.testing.simulator.behaviour import RejectKind
from polygate_celery.testing.simulator.prompts import Prompt

# How many content chunks a streamed reply is split into (fewer for tiny replies).
STREAM_PIECES = 4


@dataclass(frozen=True, slots=True)
class Failure:
    """An error answer: status, journal outcome, body, and the 429 hint if any."""

    status: int
    outcome: str
    body: dict[str, Any]
    retry_after_s: float | None = None


def error_body(
    message: str, type_: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


_INVALID = "invalid_request_error"
_REJECTIONS: dict[RejectKind, tuple[int, str, str | None, str | None, str]] = {
    # kind: (status, type, code, param, message)
    "context_length": (
        400,
        _INVALID,
        "context_length_exceeded",
        "messages",
        "This model's maximum context length is 8192 tokens. However, your messages "
        "resulted in more tokens. Please reduce the length of the messages.",
    ),
    "model_not_found": (404, _INVALID, "model_not_found", None, "The model does not exist."),
    "auth": (401, _INVALID, "invalid_api_key", None, "Incorrect API key provided."),
    "forbidden": (
        403,
        "permission_error",
        "permission_denied",
        None,
        "You are not allowed to sample from this model.",
    ),
    "content_policy": (
        400,
        _INVALID,
        "content_policy_violation",
        None,
        "Your request was rejected as a result of our safety system.",
    ),
    "bad_request": (
        400,
        _INVALID,
        None,
        "temperature",
        "Invalid 'temperature': decimal above maximum value.",
    ),
    "unprocessable": (
        422,
        _INVALID,
        "unprocessable_entity",
        None,
        "The request could not be processed.",
    ),
}


def rejection(kind: RejectKind, model: str) -> Failure:
    status, type_, code, param, message = _REJECTIONS[kind]
    if kind == "model_not_found":
        message = f"The model `{model}` does not exist or you do not have access to it."
    return Failure(status, f"{status}-{kind}", error_body(message, type_, code, param))


def unknown_model(model: str) -> Failure:
    failure = rejection("model_not_found", model)
    return Failure(404, "404-model_not_found", failure.body)


def unauthorized() -> Failure:
    """The key is never echoed, not even in part."""
    return Failure(401, "401-auth", rejection("auth", "").body)


def bad_request(message: str, param: str | None) -> Failure:
    return Failure(400, "400-bad_request", error_body(message, _INVALID, None, param))


def rate_limited(outcome: str, retry_after_s: float | None) -> Failure:
    kind = outcome.removeprefix("429-")
    messages = {
        "rpm": ("Rate limit reached for requests per minute.", "requests", "rate_limit_exceeded"),
        "tpm": ("Rate limit reached for tokens per minute.", "tokens", "rate_limit_exceeded"),
        "capacity": ("The model is at capacity. Please retry.", "requests", "server_overloaded"),
        "queued": ("Request timed out in the queue. Please retry.", "requests", "queue_timeout"),
    }
    message, type_, code = messages.get(
        kind, ("Too many requests. Please retry.", "requests", "rate_limit_exceeded")
    )
    return Failure(429, outcome, error_body(message, type_, code), retry_after_s)


def server_error(status: int, outcome: str, retry_after_s: float | None = None) -> Failure:
    if status == 429:
        return rate_limited(outcome, retry_after_s)
    message = "The server is temporarily unavailable." if status == 503 else "Simulated error."
    return Failure(status, outcome, error_body(message, "server_error", None))


def usage(prompt: Prompt) -> dict[str, int]:
    return {
        "prompt_tokens": prompt.prompt_tokens,
        "completion_tokens": prompt.completion_tokens,
        "total_tokens": prompt.total_tokens,
    }


def _envelope(kind: str, answer_id: str, model: str, created: int) -> dict[str, Any]:
    """What every chat answer and chunk opens with."""
    return {"id": answer_id, "object": kind, "created": created, "model": model}


def chat_completion(answer_id: str, model: str, created: int, prompt: Prompt) -> dict[str, Any]:
    message = {"role": "assistant", "content": prompt.answer}
    return {
        **_envelope("chat.completion", answer_id, model, created),
        "choices": [{"index": 0, "message": message, "finish_reason": prompt.finish_reason}],
        "usage": usage(prompt),
    }


def chunk(
    answer_id: str,
    model: str,
    created: int,
    delta: dict[str, str],
    finish_reason: str | None = None,
) -> dict[str, Any]:
    return {
        **_envelope("chat.completion.chunk", answer_id, model, created),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(answer_id: str, model: str, created: int, prompt: Prompt) -> dict[str, Any]:
    return {
        **_envelope("chat.completion.chunk", answer_id, model, created),
        "choices": [],
        "usage": usage(prompt),
    }


def split_reply(text: str, pieces: int = STREAM_PIECES) -> list[str]:
    """`text` in up to `pieces` consecutive, nearly equal, non-empty parts."""
    size = max(1, math.ceil(len(text) / pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


def embedding_vector(text: str, dim: int) -> list[float]:
    """A unit vector derived from a hash of `text`: the same text, the same vector."""
    raw = hashlib.shake_256(text.encode()).digest(4 * dim)
    values = [n / 2**31 - 1.0 for n in struct.unpack(f">{dim}I", raw)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def embeddings(model: str, prompt: Prompt, dim: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": embedding_vector(text, dim)}
            for i, text in enumerate(prompt.inputs)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt.prompt_tokens, "total_tokens": prompt.prompt_tokens},
    }


def ocr(model: str, prompt: Prompt) -> dict[str, Any]:
    return {
        "model": model,
        "text": prompt.answer,
        "usage": {
            "prompt_tokens": prompt.prompt_tokens,
            "completion_tokens": prompt.completion_tokens,
        },
    }
