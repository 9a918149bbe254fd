"""Testing: reading simulator requests (chat, embeddings, OCR) into a `Prompt` and its token cost.

Tokens are estimated, not counted: len(all text) // 4 for the prompt and the
answer alike, plus `IMAGE_TOKENS` per image, so tests can predict `usage` and
what `tpm` admits.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polygate_celery.testing.simulator.behaviour import ModelBehaviour

# What one image costs as prompt tokens (OpenAI's flat low-detail price).
IMAGE_TOKENS = 85


class BadRequest(ValueError):
    """The request body is not one the endpoint understands; answered with a 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Prompt:
    """What the server needs from any request: its cost, and what to answer."""

    prompt_tokens: int
    answer: str = ""  # chat and OCR text; empty for embeddings
    inputs: tuple[str, ...] = ()  # embeddings only
    stream: bool = False
    include_usage: bool = False
    finish_reason: str = "stop"
    text: str = ""  # what the request asked, for `ModelBehaviour.poison`

    @property
    def completion_tokens(self) -> int:
        return estimate_tokens(self.answer)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def estimate_tokens(text: str) -> int:
    return len(text) // 4


def image_description(size: int) -> str:
    return f"text of a {size}-byte image"


def decode_image(data: str, param: str) -> int:
    """The decoded size of a base64 image, given bare or as a `data:` URL."""
    if data.startswith("data:"):
        _, _, data = data.partition(",")
    elif "://" in data:
        raise BadRequest("Only base64 images (data: URLs) are supported.", param)
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise BadRequest("Invalid base64 image data.", param) from exc


def parse_chat(body: Mapping[str, Any], behaviour: ModelBehaviour) -> Prompt:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array.", "messages")
    texts: list[str] = []
    image_sizes: list[int] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                _read_part(part, texts, image_sizes)
        elif content is not None:
            raise BadRequest("Invalid message content.", "messages")
    answer = image_description(sum(image_sizes)) if image_sizes else behaviour.reply
    finish_reason = "stop"
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(max_tokens, int) and estimate_tokens(answer) > max_tokens:
        answer, finish_reason = answer[: max_tokens * 4], "length"
    options = body.get("stream_options") or {}
    return Prompt(
        prompt_tokens=estimate_tokens("".join(texts)) + IMAGE_TOKENS * len(image_sizes),
        answer=answer,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        finish_reason=finish_reason,
        text="\n".join(texts),
    )


def _read_part(part: Any, texts: list[str], image_sizes: list[int]) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        texts.append(part["text"])
    elif kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise BadRequest("Invalid 'image_url'.", "messages")
        image_sizes.append(decode_image(url, "messages"))
    else:
        raise BadRequest(f"Unsupported content part type: {kind!r}.", "messages")


def parse_embeddings(body: Mapping[str, Any], behaviour: ModelBehaviour) -> Prompt:
    raw = body.get("input")
    inputs = [raw] if isinstance(raw, str) else raw
    if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) for t in inputs):
        raise BadRequest("'input' must be a string or a non-empty array of strings.", "input")
    return Prompt(
        prompt_tokens=sum(estimate_tokens(t) for t in inputs),
        inputs=tuple(inputs),
        text="\n".join(inputs),
    )


def parse_ocr(body: Mapping[str, Any], behaviour: ModelBehaviour) -> Prompt:
    image = body.get("image")
    if not isinstance(image, str):
        raise BadRequest("'image' must be a base64 string.", "image")
    return Prompt(
        prompt_tokens=IMAGE_TOKENS, answer=image_description(decode_image(image, "image"))
    )
