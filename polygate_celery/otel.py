"""Edge (observability): OpenTelemetry spans of governed calls, the optional ``otel`` extra.

`OpenTelemetryHook` is a telemetry hook: give it where the other hooks go,
``configure_worker(app, config, hooks=[OpenTelemetryHook()])`` or
``Gateway(config, hooks=[OpenTelemetryHook()])``. It needs only
``opentelemetry-api``; spans go wherever the application's tracer provider
(the OpenTelemetry SDK, set up by the application) sends them, and nowhere
without one.

Spans follow the OpenTelemetry GenAI semantic conventions (v1.41, the last
release of the conventions repository that holds them):

- a span per governed call, ``{operation} {scope}`` (INTERNAL), a child of the
  current context: under ``opentelemetry-instrumentation-celery`` the task's
  own span. It is current while the call runs, so spans of an instrumented HTTP
  client nest under it. It carries `gen_ai.operation.name`, the answering
  model, the verdict (`error.type` when it is not a success) and ``polygate.*``
  attributes: scope, source, attempts, stall time, waits by cause, the task's
  deferrals so far.
- a span per attempt, ``{operation} {model}`` (CLIENT), a child of its call's:
  the provider, requested and answering models, token usage, `error.type` of a
  failure. Token usage is on attempts only, so a backend that adds usage up
  over spans counts each paid answer once.
- a span per deferral, ``defer {scope}``, a child of the call whose verdict
  deferred the task. The deferred message carries that call's W3C trace
  context (header ``polygate_trace``); the calls of the task's next run link
  to it.

Never a prompt, an answer, a provider's body or a key in any attribute, unless
`include_bodies` is set (then chat messages and answers, as
`gen_ai.input.messages` / `gen_ai.output.messages`). A server is recorded by
host and port only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.util.types import AttributeValue
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the module
    raise ImportError(
        "polygate_celery.otel needs opentelemetry-api: pip install 'polygate_celery[otel]'"
    ) from exc

from polygate_celery import __version__
from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.exchange import BODY_MARK
from polygate_celery.sources.payloads import ChatRequest, ChatResult
from polygate_celery.telemetry import (
    AttemptEvent,
    CallEvent,
    DeferralEvent,
    Event,
    SourceAlertEvent,
    VerdictEvent,
    WaitEvent,
    run_trace,
)

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
TRACE_CONTEXT = TraceContextTextMapPropagator()  # W3C, whatever the global propagator is
NS = 1_000_000_000


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


@dataclass(slots=True)
class _Call:
    """What the hook keeps of a call between its start and its verdict."""

    span: Span
    operation: str
    started_ns: int
    token: Token[Context]
    params: dict[str, AttributeValue]
    messages: str | None  # gen_ai.input.messages, with include_bodies
    waits: dict[str, list[float]] = field(default_factory=dict)  # cause -> [count, seconds]
    blocked: set[str] = field(default_factory=set)
    response_model: str | None = None


class OpenTelemetryHook:
    """A telemetry hook making OpenTelemetry spans of governed calls and deferrals.

    Args:
        tracer_provider: where spans go; default: the global one
            (``opentelemetry.trace.set_tracer_provider``), looked up at each span,
            so it may be set after the hook is made (under a prefork pool, in
            ``worker_process_init``).
        include_bodies: also record chat messages and answers
            (`gen_ai.input.messages`, `gen_ai.output.messages`) and the provider
            body excerpts of failure reasons. They hold what users wrote: off
            by default.
        providers: `gen_ai.provider.name` by source name, where the one told by
            the source's host (`PROVIDER_HOSTS`, else ``openai``) is wrong, e.g.
            ``{"local": "vllm"}``.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        include_bodies: bool = False,
        providers: Mapping[str, str] | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("polygate_celery", __version__, tracer_provider)
        self.include_bodies = include_bodies
        self._providers = dict(providers or {})
        self._calls: dict[str, _Call] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, CallEvent):
            self._start(event)
        elif isinstance(event, AttemptEvent):
            self._attempt(event)
        elif isinstance(event, WaitEvent):
            self._wait(event)
        elif isinstance(event, VerdictEvent):
            self._end(event)
        elif isinstance(event, DeferralEvent):
            self._deferral(event)
        elif isinstance(event, SourceAlertEvent):
            self._alert(event)

    # -- calls -------------------------------------------------------------------

    def _start(self, event: CallEvent) -> None:
        operation = OPERATIONS.get(event.kind, event.kind)
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": operation,
            "polygate.scope": event.scope,
        }
        links = []
        run = run_trace.get()
        if run is not None:
            attributes["polygate.task.deferrals"] = run.deferrals
            if run.previous:
                previous = _span_context(run.previous)
                if previous is not None:
                    links.append(Link(previous, {"polygate.link": "deferred_run"}))
        span = self._tracer.start_span(
            f"{operation} {event.scope}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
        )
        if not span.is_recording():
            return  # no SDK, or not sampled: nothing more to build
        payload = event.payload
        params: dict[str, AttributeValue] = {}
        messages = None
        if isinstance(payload, ChatRequest):
            params = _request_params(payload.params)
            if self.include_bodies:
                messages = _input_messages(payload.messages)
        token = otel_context.attach(trace.set_span_in_context(span))
        self._calls[event.call_id] = _Call(span, operation, time.time_ns(), token, params, messages)

    def _attempt(self, event: AttemptEvent) -> None:
        call = self._calls.get(event.call_id or "")
        if call is None:
            return
        record, outcome = event.record, event.outcome
        ended = time.time_ns()
        started = max(call.started_ns, ended - int(record.seconds * NS))
        provider = self._providers.get(record.source) or provider_of(event.server)
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": call.operation,
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,  # the name before v1.37, which some backends still read
            "polygate.scope": event.scope,
            "polygate.source": record.source,
            "polygate.attempt": event.attempt,
            "polygate.outcome": record.outcome,
            "polygate.burned_budget": record.burned_budget,
            "polygate.productive": record.productive,
            **call.params,
        }
        if event.model:
            attributes["gen_ai.request.model"] = event.model
        attributes.update(_server(event.server))
        success = record.outcome == "success"
        if outcome is not None:
            attributes.update(_usage(outcome))
            if success and isinstance(outcome.value, ChatResult) and outcome.value.finish_reason:
                attributes["gen_ai.response.finish_reasons"] = (outcome.value.finish_reason,)
        if record.status is not None:
            attributes["http.response.status_code"] = record.status
        if not success:
            timed_out = outcome is not None and outcome.timed_out
            attributes["error.type"] = error_type(record.outcome, timed_out)
            if record.reason:
                attributes["polygate.reason"] = self._reason(record.reason)
        if self.include_bodies:
            if call.messages is not None:
                attributes["gen_ai.input.messages"] = call.messages
            if success and outcome is not None and isinstance(outcome.value, ChatResult):
                attributes["gen_ai.output.messages"] = _output_messages(outcome.value)
        name = f"{call.operation} {event.model}" if event.model else call.operation
        span = self._tracer.start_span(
            name,
            context=trace.set_span_in_context(call.span),
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=started,
        )
        if not success:
            span.set_status(Status(StatusCode.ERROR, str(attributes["error.type"])))
        span.end(end_time=ended)
        if success:
            call.response_model = (outcome.model if outcome else None) or event.model

    def _wait(self, event: WaitEvent) -> None:
        call = self._calls.get(event.call_id or "")
        if call is None:
            return
        tally = call.waits.setdefault(event.cause, [0, 0.0])
        tally[0] += 1
        tally[1] += max(0.0, event.seconds)
        call.blocked.update(f"{source}: {reason}" for source, reason in event.blocked)

    def _end(self, event: VerdictEvent) -> None:
        call = self._calls.pop(event.call_id or "", None)
        if call is None:
            return
        span = call.span
        attributes: dict[str, AttributeValue] = {
            "polygate.verdict": event.verdict,
            "polygate.attempts": event.attempts,
            "polygate.stalled_s": round(event.stalled_s, 6),
        }
        if event.source is not None:
            attributes["polygate.source"] = event.source
        if event.retry_after_s is not None:
            attributes["polygate.retry_after_s"] = round(event.retry_after_s, 6)
        for cause, (count, seconds) in sorted(call.waits.items()):
            attributes[f"polygate.wait.{cause}.count"] = int(count)
            attributes[f"polygate.wait.{cause}.seconds"] = round(seconds, 6)
        if call.blocked:
            attributes["polygate.wait.blocked"] = tuple(sorted(call.blocked))
        if event.verdict == "success":
            if call.response_model:
                attributes["gen_ai.response.model"] = call.response_model
        else:
            attributes["error.type"] = event.verdict
            span.set_status(Status(StatusCode.ERROR, event.verdict))
        span.set_attributes(attributes)
        run = run_trace.get()
        if run is not None:  # a deferral of this run carries on its latest call's context
            carrier: dict[str, str] = {}
            TRACE_CONTEXT.inject(carrier, context=trace.set_span_in_context(span))
            run.latest = carrier
        try:
            otel_context.detach(call.token)
        finally:
            span.end()

    # -- beside calls ------------------------------------------------------------

    def _deferral(self, event: DeferralEvent) -> None:
        run = run_trace.get()
        parent = TRACE_CONTEXT.extract(run.latest) if run is not None and run.latest else None
        attributes: dict[str, AttributeValue] = {
            "polygate.deferral.reason": event.reason,
            "polygate.deferral.count": event.deferrals,
            "polygate.deferral.delay_s": round(event.delay_s, 6),
            "polygate.deferral.strategy": event.strategy,
        }
        if event.scope is not None:
            attributes["polygate.scope"] = event.scope
        if event.retry_after_s is not None:
            attributes["polygate.retry_after_s"] = round(event.retry_after_s, 6)
        span = self._tracer.start_span(
            f"defer {event.scope or 'task'}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        span.end()

    def _alert(self, event: SourceAlertEvent) -> None:
        span = trace.get_current_span()  # the call's, while the call runs
        if span.is_recording():
            span.add_event(
                "polygate.source_alert",
                {
                    "polygate.source": event.source,
                    "polygate.alert.reason": event.reason,
                    "polygate.alert.paused_for_s": event.paused_for_s,
                },
            )

    def _reason(self, reason: str) -> str:
        """A failure's classified reason; a provider body's excerpt only with bodies on."""
        if self.include_bodies:
            return reason
        return reason.split(BODY_MARK, 1)[0]


def _span_context(carrier: Mapping[str, str]) -> trace.SpanContext | None:
    context = TRACE_CONTEXT.extract(dict(carrier))
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def _server(server: str | None) -> dict[str, AttributeValue]:
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


def _usage(outcome: Outcome) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    if outcome.model:
        attributes["gen_ai.response.model"] = outcome.model
    if outcome.prompt_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = outcome.prompt_tokens
    if outcome.completion_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = outcome.completion_tokens
    return attributes


def _request_params(params: Mapping[str, Any]) -> dict[str, AttributeValue]:
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


def _input_messages(messages: Sequence[Mapping[str, Any]]) -> str:
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


def _output_messages(result: ChatResult) -> str:
    message = {
        "role": "assistant",
        "parts": [{"type": "text", "content": result.text}],
        "finish_reason": result.finish_reason or "stop",
    }
    return json.dumps([message], ensure_ascii=False)
