"""Source layer: what a call asks a model source for, and what a success carries back.

The loop never looks inside these: an adapter dispatches on the request's type.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """An OpenAI-style chat completion request. `params` go into the body as given
    (temperature, max_tokens, ...); `stream` overrides the source's own setting."""

    messages: Sequence[Mapping[str, Any]]
    params: Mapping[str, Any] = field(default_factory=dict)
    stream: bool | None = None


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    inputs: Sequence[str]

    @classmethod
    def of(cls, inputs: Sequence[str] | str) -> EmbeddingRequest:
        """A request for `inputs` (a single string is one input)."""
        return cls([inputs] if isinstance(inputs, str) else list(inputs))


@dataclass(frozen=True, slots=True)
class OcrRequest:
    """An image to turn into text; `prompt` overrides the source's OCR prompt."""

    image: bytes
    mime: str = "image/png"
    prompt: str | None = None

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.image).decode()}"


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The answer: its text, why it ended, and any tool calls, reasoning or refusal."""

    text: str
    finish_reason: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    refusal: str | None = None


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    vectors: list[list[float]]


@dataclass(frozen=True, slots=True)
class OcrResult:
    text: str


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def estimate_tokens(request: object) -> int:
    """A rough token count to reserve against TPM quotas before the call (settled after).

    About four characters a token for text, the requested `max_tokens` (or 256)
    for the answer, and a flat thousand for an image.
    """
    if isinstance(request, ChatRequest):
        prompt = sum(len(_text_of(m.get("content"))) for m in request.messages) // 4
        images = sum(
            1
            for m in request.messages
            if isinstance(m.get("content"), list)
            for p in m["content"]
            if isinstance(p, dict) and p.get("type") == "image_url"
        )
        return prompt + 1000 * images + int(request.params.get("max_tokens", 256))
    if isinstance(request, EmbeddingRequest):
        return sum(len(text) for text in request.inputs) // 4 + len(request.inputs)
    if isinstance(request, OcrRequest):
        return 1000 + 512
    return 0
