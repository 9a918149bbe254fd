"""OpenTelemetry spans of governed calls: names and attributes as the GenAI semantic
conventions say, parentage, error.type, deferral links, and nothing secret in a span."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from polygate_celery import AllSourcesExhausted, Outcome, SourceFatalError, parse_config
from polygate_celery.governance import loop
from polygate_celery.otel import OpenTelemetryHook, provider_of
from polygate_celery.sources.exchange import BODY_MARK
from polygate_celery.sources.payloads import ChatResult
from polygate_celery.store import MemoryStore
from polygate_celery.telemetry import RunTrace, run_trace
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import CANARY_KEY, GatewayFactory, make_config

PRIORITIES = {
    "sources": {"a": {}},
    "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
    "priorities": {"interactive": {}, "batch": {}},
}

# The GenAI attributes of the OpenTelemetry semantic conventions v1.41.1 (the last release
# of open-telemetry/semantic-conventions holding them): model/gen-ai/registry.yaml, and
# gen_ai.system, the deprecated name of gen_ai.provider.name, from
# model/gen-ai/deprecated/registry-deprecated.yaml.
GEN_AI_ATTRIBUTES = frozenset(
    [
        "gen_ai.agent.description",
        "gen_ai.agent.id",
        "gen_ai.agent.name",
        "gen_ai.agent.version",
        "gen_ai.conversation.id",
        "gen_ai.data_source.id",
        "gen_ai.embeddings.dimension.count",
        "gen_ai.evaluation.explanation",
        "gen_ai.evaluation.name",
        "gen_ai.evaluation.score.label",
        "gen_ai.evaluation.score.value",
        "gen_ai.input.messages",
        "gen_ai.operation.name",
        "gen_ai.output.messages",
        "gen_ai.output.type",
        "gen_ai.prompt.name",
        "gen_ai.provider.name",
        "gen_ai.request.choice.count",
        "gen_ai.request.encoding_formats",
        "gen_ai.request.frequency_penalty",
        "gen_ai.request.max_tokens",
        "gen_ai.request.model",
        "gen_ai.request.presence_penalty",
        "gen_ai.request.seed",
        "gen_ai.request.stop_sequences",
        "gen_ai.request.stream",
        "gen_ai.request.temperature",
        "gen_ai.request.top_k",
        "gen_ai.request.top_p",
        "gen_ai.response.finish_reasons",
        "gen_ai.response.id",
        "gen_ai.response.model",
        "gen_ai.response.time_to_first_chunk",
        "gen_ai.retrieval.documents",
        "gen_ai.retrieval.query.text",
        "gen_ai.system_instructions",
        "gen_ai.token.type",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.id",
        "gen_ai.tool.call.result",
        "gen_ai.tool.definitions",
        "gen_ai.tool.description",
        "gen_ai.tool.name",
        "gen_ai.tool.type",
        "gen_ai.usage.cache_creation.input_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.reasoning.output_tokens",
        "gen_ai.workflow.name",
        "gen_ai.system",
    ]
)
# Other registry attributes the spans use (error, server, http registries).
GENERAL_ATTRIBUTES = frozenset(
    {"error.type", "server.address", "server.port", "http.response.status_code"}
)
# gen_ai.operation.name's well-known values.
OPERATIONS = {"chat", "generate_content", "text_completion", "embeddings", "retrieval"}

PROMPT = "PROMPT-4e1d: the quarterly numbers of ACME"
ANSWER = "ANSWER-9b2c: up 12 percent"
SECRET_URL = f"https://svc:{CANARY_KEY}@api.openai.com/v1?api-key={CANARY_KEY}"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
def otel(provider: TracerProvider) -> OpenTelemetryHook:
    return OpenTelemetryHook(provider)


class Answering:
    """A source that answers a chat as a provider does: a model name and token usage."""

    def __init__(self, clock: VirtualClock, model: str, text: str = ANSWER) -> None:
        self.clock, self.model, self.text = clock, model, text

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        await self.clock.sleep(0.5)
        return Outcome.success(
            ChatResult(self.text, "stop"), model=self.model, prompt_tokens=11, completion_tokens=7
        )


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    spans = exporter.get_finished_spans()
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def assert_conventional(spans: Any) -> None:
    """Every attribute is a GenAI or general registry name, or the package's own."""
    for span in spans:
        for key in attrs(span):
            if key.startswith("gen_ai."):
                assert key in GEN_AI_ATTRIBUTES, (span.name, key)
            else:
                assert key in GENERAL_ATTRIBUTES or key.startswith("polygate."), (span.name, key)
        if span.kind is SpanKind.CLIENT:  # a GenAI client span: its required attributes
            assert attrs(span)["gen_ai.operation.name"] in OPERATIONS
            assert attrs(span)["gen_ai.provider.name"]
            model = attrs(span).get("gen_ai.request.model")
            operation = attrs(span)["gen_ai.operation.name"]
            assert span.name == (f"{operation} {model}" if model else operation)


def two_sources(**scope: Any) -> Any:
    return make_config(
        "chat",
        {
            "a": {"base_url": SECRET_URL, "model": "gpt-a", "api_key": CANARY_KEY},
            "b": {"base_url": "http://vllm.internal:8000/v1", "model": "llama"},
        },
        **scope,
    )


async def test_a_call_is_a_span_and_each_attempt_a_client_span_as_the_conventions_say(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
) -> None:
    a = ScriptedSource(clock, [steps.rate_limited(duration_s=0.2)])
    b = Answering(clock, "llama-3.1-8b-instruct")
    gw = own_store_gateway(two_sources(), {"a": a, "b": b}, store=MemoryStore(clock), hooks=[otel])
    messages = [{"role": "user", "content": PROMPT}]
    result = await gw.chat("s", messages, temperature=0.2, max_tokens=64)
    assert result.source == "b"
    await gw.aclose()

    spans = by_name(exporter)
    assert set(spans) == {"chat s", "chat gpt-a", "chat llama"}
    assert_conventional(spans.values())
    call, refused, served = spans["chat s"], spans["chat gpt-a"], spans["chat llama"]
    assert call.kind is SpanKind.INTERNAL
    assert call.parent is None
    for attempt in (refused, served):
        assert attempt.kind is SpanKind.CLIENT
        assert attempt.parent is not None
        assert attempt.parent.span_id == call.context.span_id
        assert attempt.context.trace_id == call.context.trace_id

    assert attrs(refused) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-a",
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.max_tokens": 64,
        "server.address": "api.openai.com",
        "server.port": 443,
        "http.response.status_code": 429,
        "error.type": "rate_limited",
        "polygate.scope": "s",
        "polygate.source": "a",
        "polygate.attempt": 1,
        "polygate.outcome": "rate_limited",
        "polygate.burned_budget": False,  # chat: a 429 is waiting, not a failure
        "polygate.productive": False,
    }
    assert refused.status.status_code is StatusCode.ERROR
    assert attrs(served) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",  # any OpenAI-compatible host
        "gen_ai.system": "openai",
        "gen_ai.request.model": "llama",
        "gen_ai.response.model": "llama-3.1-8b-instruct",
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.max_tokens": 64,
        "gen_ai.usage.input_tokens": 11,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.response.finish_reasons": ("stop",),
        "server.address": "vllm.internal",
        "server.port": 8000,
        "polygate.scope": "s",
        "polygate.source": "b",
        "polygate.attempt": 2,
        "polygate.outcome": "success",
        "polygate.burned_budget": False,
        "polygate.productive": True,
    }
    assert served.status.status_code is StatusCode.UNSET
    call_attrs = attrs(call)
    assert call_attrs["gen_ai.operation.name"] == "chat"
    assert call_attrs["gen_ai.response.model"] == "llama-3.1-8b-instruct"
    assert call_attrs["polygate.verdict"] == "success"
    assert call_attrs["polygate.source"] == "b"
    assert call_attrs["polygate.attempts"] == 2
    assert call_attrs["polygate.wait.backoff.count"] == 1
    assert "error.type" not in call_attrs
    # Usage is counted once, on the attempt that was paid for.
    assert not any(k.startswith("gen_ai.usage.") for k in call_attrs)
    # The attempts lie within their call, in order.
    assert call.start_time is not None
    assert call.end_time is not None
    assert call.start_time <= refused.start_time <= served.start_time <= call.end_time  # type: ignore[operator]


@pytest.mark.parametrize(
    ("kind", "operation", "call"),
    [
        ("embedding", "embeddings", lambda gw: gw.embed("s", ["a text"])),
        ("ocr", "generate_content", lambda gw: gw.ocr("s", b"png")),
    ],
)
async def test_the_operation_is_named_by_the_scope_kind(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
    kind: str,
    operation: str,
    call: Any,
) -> None:
    source = ScriptedSource.always(clock, steps.ok(tokens=3))
    config = make_config(kind, {"a": {"model": "m-1", "base_url": "https://api.mistral.ai/v1"}})
    gw = own_store_gateway(config, {"a": source}, store=MemoryStore(clock), hooks=[otel])
    await call(gw)
    await gw.aclose()
    spans = by_name(exporter)
    assert set(spans) == {f"{operation} s", f"{operation} m-1"}
    assert_conventional(spans.values())
    attempt = attrs(spans[f"{operation} m-1"])
    assert attempt["gen_ai.provider.name"] == "mistral_ai"
    assert attempt["gen_ai.usage.output_tokens"] == 3


async def test_the_call_span_names_its_class_and_any_tenant(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
) -> None:
    config = parse_config(PRIORITIES)  # classes interactive, then batch (the default)
    source = ScriptedSource.always(clock, steps.ok())
    gw = own_store_gateway(config, {"a": source}, store=MemoryStore(clock), hooks=[otel])
    messages = [{"role": "user", "content": "hi"}]
    await gw.chat("s", messages, priority="interactive", tenant="customer-1042")
    await gw.chat("s", messages)
    await gw.aclose()
    named, unnamed = (
        attrs(span) for span in exporter.get_finished_spans() if span.kind is SpanKind.INTERNAL
    )
    assert_conventional(exporter.get_finished_spans())
    # Any tenant, declared or not: spans are sampled, not aggregated into series.
    assert (named["polygate.priority"], named["polygate.tenant"]) == (
        "interactive",
        "customer-1042",
    )
    assert unnamed["polygate.priority"] == "batch"  # the default class
    assert "polygate.tenant" not in unnamed


async def test_failures_carry_error_type_on_attempts_and_the_verdict_on_the_call(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
) -> None:
    source = ScriptedSource(clock, [steps.server_error(status=503), steps.timeout()])
    config = make_config(
        "embedding", {"a": {"model": "e-1", "timeout_s": 5}}, max_attempts=2, backoff_base_s=1
    )
    gw = own_store_gateway(config, {"a": source}, store=MemoryStore(clock), hooks=[otel])
    with pytest.raises(AllSourcesExhausted, match="retry_exhausted"):
        await gw.embed("s", ["x"])
    await gw.aclose()
    spans = exporter.get_finished_spans()
    assert_conventional(spans)
    call = next(s for s in spans if s.kind is SpanKind.INTERNAL)
    attempts = sorted(
        (s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: attrs(s)["polygate.attempt"]
    )
    assert [attrs(s)["error.type"] for s in attempts] == ["transient", "timeout"]
    assert attrs(attempts[0])["http.response.status_code"] == 503
    assert attrs(attempts[0])["polygate.reason"] == "server error"
    assert all(s.status.status_code is StatusCode.ERROR for s in attempts)
    assert attrs(call)["error.type"] == "retry_exhausted"
    assert attrs(call)["polygate.verdict"] == "retry_exhausted"
    assert call.status.status_code is StatusCode.ERROR
    assert call.status.description == "retry_exhausted"


async def test_a_fatal_answer_and_a_stall_are_their_verdicts(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
) -> None:
    store = MemoryStore(clock)
    source = ScriptedSource(clock, [steps.fatal("content policy")])
    config = make_config("chat", stall_window_s=10, poll_interval_s=1)
    gw = own_store_gateway(config, {"a": source}, store=store, hooks=[otel])
    with pytest.raises(SourceFatalError):
        await gw.chat("s", [{"role": "user", "content": PROMPT}])
    await store.pause_source("a", 100)
    with pytest.raises(AllSourcesExhausted, match="stalled"):
        await gw.chat("s", [{"role": "user", "content": PROMPT}])
    await gw.aclose()
    fatal, stalled = (s for s in exporter.get_finished_spans() if s.kind is SpanKind.INTERNAL)
    assert attrs(fatal)["error.type"] == "fatal"
    stall = attrs(stalled)
    assert stall["error.type"] == "stalled"
    assert stall["polygate.attempts"] == 0
    assert stall["polygate.stalled_s"] > 10
    assert stall["polygate.retry_after_s"] > 0
    assert stall["polygate.wait.no_runnable.count"] >= 10
    assert stall["polygate.wait.no_runnable.seconds"] > 10
    assert stall["polygate.wait.blocked"] == ("a: paused",)


async def test_no_prompt_answer_provider_body_or_key_in_any_span(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
) -> None:
    # A failure reason with a provider body's excerpt (what include_bodies in the
    # configuration adds), echoing the prompt.
    body_reason = f"server error{BODY_MARK}{{'echo': '{PROMPT}'}}"
    failure = steps.Step("server_error", status=500, reason=body_reason)
    a = ScriptedSource(clock, [failure, steps.auth_rejected()])  # and an alert
    b = Answering(clock, "llama-3.1")
    gw = own_store_gateway(
        two_sources(same_source_retries=1), {"a": a, "b": b}, store=MemoryStore(clock), hooks=[otel]
    )
    await gw.chat("s", [{"role": "system", "content": PROMPT}, {"role": "user", "content": PROMPT}])
    await gw.aclose()
    spans = exporter.get_finished_spans()
    assert len(spans) == 4
    dumped = "\n".join(span.to_json() for span in spans)
    for secret in (CANARY_KEY, "PROMPT-4e1d", "ANSWER-9b2c", "provider body", "svc"):
        assert secret not in dumped
    call = next(s for s in spans if s.kind is SpanKind.INTERNAL)
    (alert,) = call.events
    assert alert.name == "polygate.source_alert"
    assert dict(alert.attributes or {})["polygate.source"] == "a"


async def test_bodies_are_recorded_only_when_asked_for(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    hook = OpenTelemetryHook(provider, include_bodies=True)
    gw = own_store_gateway(
        two_sources(),
        {"a": Answering(clock, "gpt-a-0613"), "b": Answering(clock, "x")},
        store=MemoryStore(clock),
        hooks=[hook],
    )
    await gw.chat("s", [{"role": "user", "content": PROMPT}])
    await gw.aclose()
    attempt = attrs(by_name(exporter)["chat gpt-a"])
    assert json.loads(attempt["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}
    ]
    assert json.loads(attempt["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": ANSWER}],
            "finish_reason": "stop",
        }
    ]
    assert CANARY_KEY not in "\n".join(s.to_json() for s in exporter.get_finished_spans())


async def test_the_call_span_is_a_child_of_the_current_span_and_current_while_it_runs(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    provider: TracerProvider,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
) -> None:
    tracer = provider.get_tracer("test")

    class Instrumented:  # as an instrumented HTTP client would: a span of its own
        async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
            with tracer.start_as_current_span("POST"):
                return Outcome.success("ok")

    gw = own_store_gateway(
        make_config("chat"), {"a": Instrumented()}, store=MemoryStore(clock), hooks=[otel]
    )
    with tracer.start_as_current_span("run/ask") as task_span:
        await gw.call("s", "x")
        assert trace.get_current_span() is task_span  # the call's context is gone with it
    await gw.aclose()
    spans = by_name(exporter)
    call, http = spans["chat s"], spans["POST"]
    assert call.parent is not None
    assert call.parent.span_id == spans["run/ask"].context.span_id
    assert http.parent is not None
    assert http.parent.span_id == call.context.span_id


async def test_a_run_s_calls_link_to_the_call_that_deferred_its_previous_run(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
) -> None:
    """What the Celery edge does around a task's runs (tests/celery/test_otel.py runs it
    through a real worker): the first run's deferring call hands its trace context on, in
    `RunTrace.latest`; the next run starts with it as `previous`."""
    store = MemoryStore(clock)
    source = ScriptedSource.always(clock, steps.ok())
    gw = own_store_gateway(make_config("chat"), {"a": source}, store=store, hooks=[otel])
    first = RunTrace()
    token = run_trace.set(first)
    try:
        await store.pause_source("a", 100)
        with pytest.raises(AllSourcesExhausted, match="fail_fast"):
            await gw.call("s", "x", fail_fast=True)
    finally:
        run_trace.reset(token)
    assert first.latest is not None
    assert set(first.latest) == {"traceparent"}
    json.dumps(first.latest)  # a message header: JSON-safe
    await clock.sleep(101)  # the pause is over
    token = run_trace.set(RunTrace(previous=first.latest, deferrals=1))
    try:
        await gw.call("s", "x")
    finally:
        run_trace.reset(token)
    await gw.aclose()
    deferred, later = (s for s in exporter.get_finished_spans() if s.kind is SpanKind.INTERNAL)
    assert attrs(deferred)["error.type"] == "fail_fast"
    assert attrs(later)["polygate.task.deferrals"] == 1
    (link,) = later.links
    assert link.context.span_id == deferred.context.span_id
    assert link.context.trace_id == deferred.context.trace_id
    assert dict(link.attributes or {}) == {"polygate.link": "deferred_run"}


async def test_an_unexpected_exception_ends_the_call_span(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    otel: OpenTelemetryHook,
    exporter: InMemorySpanExporter,
) -> None:
    class Broken:
        async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
            raise RuntimeError("adapter bug")

    gw = own_store_gateway(
        make_config("chat"), {"a": Broken()}, store=MemoryStore(clock), hooks=[otel]
    )
    with pytest.raises(RuntimeError):
        await gw.call("s", "x")
    await gw.aclose()
    (call,) = exporter.get_finished_spans()
    assert attrs(call)["error.type"] == "error"
    assert not otel._calls  # nothing kept of an ended call


async def test_without_hooks_no_event_is_built_and_without_an_sdk_no_state_is_kept(
    clock: VirtualClock, own_store_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = ScriptedSource.always(clock, steps.ok())
    gw = own_store_gateway(make_config("chat"), {"a": source}, store=MemoryStore(clock), hooks=[])

    def no_event(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an event was built with no hook listening")

    with monkeypatch.context() as patched:
        for name in ("CallEvent", "AttemptEvent", "VerdictEvent", "WaitEvent"):
            patched.setattr(loop, name, no_event)
        await gw.call("s", "x")
    await gw.aclose()

    noop = OpenTelemetryHook(trace.NoOpTracerProvider())
    gw = own_store_gateway(
        make_config("chat"), {"a": source}, store=MemoryStore(clock), hooks=[noop]
    )
    await gw.call("s", "x")
    assert not noop._calls
    await gw.aclose()


@pytest.mark.parametrize(
    ("server", "provider"),
    [
        ("https://api.openai.com:443", "openai"),
        ("https://myres.openai.azure.com:443", "azure.ai.openai"),
        ("https://api.anthropic.com:443", "anthropic"),
        ("https://generativelanguage.googleapis.com:443", "gcp.gemini"),
        ("https://us-central1-aiplatform.googleapis.com:443", "gcp.vertex_ai"),
        ("https://bedrock-runtime.eu-west-1.amazonaws.com:443", "aws.bedrock"),
        ("https://api.groq.com:443", "groq"),
        ("http://vllm:8000", "openai"),
        (None, "openai"),
        ("https://notapi.openai.com.evil:443", "openai"),
    ],
)
def test_the_provider_is_told_by_the_host(server: str | None, provider: str) -> None:
    assert provider_of(server) == provider


async def test_a_provider_named_by_the_user_wins(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    hook = OpenTelemetryHook(provider, providers={"a": "vllm"})
    gw = own_store_gateway(
        make_config("chat", {"a": {"model": "m"}}),
        {"a": ScriptedSource.always(clock, steps.ok())},
        store=MemoryStore(clock),
        hooks=[hook],
    )
    await gw.call("s", "x")
    await gw.aclose()
    assert attrs(by_name(exporter)["chat m"])["gen_ai.provider.name"] == "vllm"
