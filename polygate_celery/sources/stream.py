"""Source layer: assembling a streamed chat answer, chunk by chunk, into one result.

The assembly knows when an answer is whole: the chunk with a `finish_reason`
(or, when usage was asked for, the usage chunk after it) completes it at once,
with or without a ``[DONE]`` sentinel. A stream that ends, stalls or breaks
before that is never passed off as a success. Text, reasoning, refusals and
tool calls are all answer: any of them counts as the first token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.payloads import ChatResult

DONE = "[DONE]"


class MalformedChunk(ValueError):
    """A `data:` line that is not a chat completion chunk."""


def data_of(line: str) -> str | None:
    """What a `data:` line of an event stream carries; None for any other line
    (blank separators, comments, event names)."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


@dataclass
class _ToolCall:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": "".join(self.arguments)}
        return {"id": self.id, "type": self.type, "function": function}


@dataclass
class StreamAssembly:
    """Feeds on SSE lines (or parsed chunks); `done` once the answer is whole."""

    want_usage: bool
    parts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    tools: dict[int, _ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    first_token: bool = False
    done: bool = False
    error: dict[str, Any] | None = None

    def feed(self, line: str) -> bool:
        """Take one line of the event stream; True if it carried data (not a comment).

        Raises `MalformedChunk` on a bad one.
        """
        data = data_of(line)
        if data is None:
            return False
        if data == DONE:
            self.sentinel()
            return True
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            raise MalformedChunk("a chunk that is not JSON") from None
        self.take_data(chunk)
        return True

    def sentinel(self) -> None:
        """Take the ``[DONE]`` sentinel."""
        if self.finish_reason is None:
            raise MalformedChunk("[DONE] before the final chunk")
        self.done = True

    def take_data(self, chunk: Any) -> None:
        """Take one `data:` line's decoded JSON: a chunk, or an error in the stream."""
        if not isinstance(chunk, dict):
            raise MalformedChunk("a chunk that is not an object")
        if "error" in chunk:
            self.error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            return
        self.take(chunk)

    def take(self, chunk: dict[str, Any]) -> None:
        """Take one parsed chunk (as an SDK yields it)."""
        model = chunk.get("model")
        self.model = model if isinstance(model, str) else self.model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise MalformedChunk("a chunk without choices")
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._delta(choice.get("delta"))
                if choice.get("finish_reason"):
                    self.finish_reason = str(choice["finish_reason"])
        if self.finish_reason is not None and (not self.want_usage or self.usage is not None):
            self.done = True

    def _delta(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        for key, into in (
            ("content", self.parts),
            ("reasoning_content", self.reasoning),
            ("reasoning", self.reasoning),
            ("refusal", self.refusal),
        ):
            text = delta.get(key)
            if isinstance(text, str) and text:
                into.append(text)
                self.first_token = True
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if not isinstance(call, dict):
                continue
            index = call.get("index", 0)
            tool = self.tools.setdefault(index if isinstance(index, int) else 0, _ToolCall())
            tool.id = call.get("id") or tool.id
            function = call.get("function")
            if isinstance(function, dict):
                tool.name += function.get("name") or ""
                tool.arguments.append(function.get("arguments") or "")
            self.first_token = True

    @property
    def whole(self) -> bool:
        """The answer itself is complete (usage may still be on its way)."""
        return self.finish_reason is not None

    def outcome(self) -> Outcome:
        usage = self.usage or {}
        result = ChatResult(
            "".join(self.parts),
            self.finish_reason,
            tool_calls=[self.tools[i].as_dict() for i in sorted(self.tools)],
            reasoning="".join(self.reasoning) or None,
            refusal="".join(self.refusal) or None,
        )
        return Outcome.success(
            result,
            status=200,
            model=self.model,
            prompt_tokens=count(usage.get("prompt_tokens")),
            completion_tokens=count(usage.get("completion_tokens")),
        )


def count(value: Any) -> int | None:
    """A token count as the provider reported it, if it is one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
