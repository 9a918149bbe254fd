"""Edge (observability): span attributes of governed calls, as the GenAI conventions name them.

What a call, an attempt or a request says as OpenTelemetry attributes: the
operation, the provider told by the source's host, the server by host and port
only, token usage, the request's settings (never its content) and, with
`include_bodies` alone, the messages in the conventions' JSON shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.util.types import AttributeValue

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.payloads import ChatResult

# A scope's kind as a `gen_ai.operation.name`: OCR sends an image and gets text back,
# the conventions' multimodal "generate_content".
OPERATIONS = {"chat": "chat", "embedding": "embeddings", "ocr": "generate_content"}
# `gen_ai.provider.name` by the host of a source's base URL (the conventions' values);
# any other host speaks the OpenAI API, the only one sources speak: "openai".
PROVIDER_HOSTS: tuple[tuple[str, str], ...] = (
    ("api.openai.com", "openai"),
    ("openai.azure.com", "azure.ai.openai"),
    ("services.ai.azure.com", "azure.ai.inference"),
    ("inference.ai.azure.com", "azure.ai.inference"),
    ("api.anthropic.com", "anthropic"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("api.cohere.com", "cohere"),
    ("api.cohere.ai", "cohere"),
)
DEFAULT_PROVIDER = "openai"
# Chat parameters recorded as `gen_ai.request.*` (settings, never content).
REQUEST_PARAMS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}


def provider_of(server: str | None) -> str:
    """`gen_ai.provider.name` of a source whose origin is `server` (see `PROVIDER_HOSTS`)."""
    host = (urlsplit(server).hostname or "") if server else ""
    for domain, provider in PROVIDER_HOSTS:
        # the host itself, a subdomain, or a regional prefix (us-central1-aiplatform...)
        if host == domain or host.endswith((f".{domain}", f"-{domain}")):
            return provider
    if host.startswith("bedrock-runtime.") and host.endswith(".amazonaws.com"):
        return "aws.bedrock"
    return DEFAULT_PROVIDER


def error_type(outcome: str, timed_out: bool) -> str:
    """An attempt's `error.type`: ``timeout``, else its classification (``rate_limited``,
    ``transient``, ``source_rejected``, ``fatal``); the HTTP status goes on
    ``http.response.status_code``."""
    return "timeout" if timed_out else outcome


def server_attributes(server: str | None) -> dict[str, AttributeValue]:
    """`server.address` and `server.port` of a source's origin (no user, path or query)."""
    if not server:
        return {}
    parts = urlsplit(server)
    if not parts.hostname:
        return {}
    attributes: dict[str, AttributeValue] = {"server.address": parts.hostname}
    if parts.port is not None:
        attributes["server.port"] = parts.port
    return attributes


def usage_attributes(outcome: Outcome) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    if outcome.model:
        attributes["gen_ai.response.model"] = outcome.model
    if outcome.prompt_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = outcome.prompt_tokens
    if outcome.completion_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = outcome.completion_tokens
    return attributes


def request_params(params: Mapping[str, Any]) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    for name, attribute in REQUEST_PARAMS.items():
        value = params.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[attribute] = value
    stop = params.get("stop")
    if isinstance(stop, str):
        attributes["gen_ai.request.stop_sequences"] = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        attributes["gen_ai.request.stop_sequences"] = tuple(stop)
    return attributes


def input_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """Chat messages as the conventions' input messages (JSON): text parts kept, other
    parts (an image) named by their type only."""
    converted = []
    for message in messages:
        content = message.get("content")
        parts: list[dict[str, Any]] = []
        if isinstance(content, str):
            parts.append({"type": "text", "content": content})
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "text":
                    parts.append({"type": "text", "content": part.get("text", "")})
                elif isinstance(part, Mapping):
                    parts.append({"type": str(part.get("type", "unknown"))})
        converted.append({"role": str(message.get("role", "user")), "parts": parts})
    return json.dumps(converted, ensure_ascii=False)


def output_messages(result: ChatResult) -> str:
    message = {
        "role": "assistant",
        "parts": [{"type": "text", "content": result.text}],
        "finish_reason": result.finish_reason or "stop",
    }
    return json.dumps([message], ensure_ascii=False)
