"""Source layer: assembling a streamed chat answer, chunk by chunk, into one result.

The assembly knows when an answer is whole: the chunk with a `finish_reason`
(or, when usage was asked for, the usage chunk after it) completes it at once,
with or without a ``[DONE]`` sentinel. A stream that ends, stalls or breaks
before that is never passed off as a success.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.payloads import ChatResult


class MalformedChunk(ValueError):
    """A `data:` line that is not a chat completion chunk."""


@dataclass
class StreamAssembly:
    """Feeds on SSE lines; `done` once the answer is whole."""

    want_usage: bool
    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    first_token: bool = False
    done: bool = False
    error: dict[str, Any] | None = None

    def feed(self, line: str) -> None:
        """Take one line of the event stream. Raises `MalformedChunk` on a bad one."""
        if not line.startswith("data:"):
            return  # blank separators, comments (":"), event names
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = self.finish_reason is not None
            if not self.done:
                raise MalformedChunk("[DONE] before the final chunk")
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise MalformedChunk("a chunk that is not JSON") from None
        if not isinstance(chunk, dict):
            raise MalformedChunk("a chunk that is not an object")
        if "error" in chunk:
            self.error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            return
        self.take(chunk)

    def take(self, chunk: dict[str, Any]) -> None:
        """Take one parsed chunk (as an SDK yields it)."""
        self.model = chunk.get("model") or self.model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise MalformedChunk("a chunk without choices")
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str) and content:
                self.parts.append(content)
                self.first_token = True
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        if self.finish_reason is not None and (not self.want_usage or self.usage is not None):
            self.done = True

    @property
    def whole(self) -> bool:
        """The answer itself is complete (usage may still be on its way)."""
        return self.finish_reason is not None

    def outcome(self) -> Outcome:
        usage = self.usage or {}
        return Outcome.success(
            ChatResult("".join(self.parts), self.finish_reason),
            status=200,
            model=self.model,
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
