"""OpenTelemetry through a real worker: call spans nest under the task spans of
opentelemetry-instrumentation-celery, and a deferred task's next run links to the call
that deferred it (the deferred message carries its W3C trace context)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from polygate_celery.celery import DEFERRED
from polygate_celery.otel import OpenTelemetryHook
from tests.celery.app import ask
from tests.celery.conftest import Worker
from tests.celery.test_outcomes import DEFER_PAUSE_S, pause, wait_for_state


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An SDK provider with an in-memory exporter, and Celery instrumented onto it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_deferred_task_s_next_run_links_to_the_call_that_deferred_it(
    governed_worker: Worker, traced: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = traced
    with governed_worker(hooks=[OpenTelemetryHook(provider)]) as runtime:
        pause(runtime, "main", DEFER_PAUSE_S)
        result = ask.delay("now or later", fail_fast=True)
        wait_for_state(result, DEFERRED)
        assert result.get(timeout=30) == "fine"

    spans = exporter.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans}
    calls = sorted(
        (s for s in spans if s.name == "chat chat"),
        key=lambda s: s.start_time or 0,
    )
    assert len(calls) >= 2  # deferred at least once, then served
    *deferred, served = calls
    assert all(attrs(c)["error.type"] == "fail_fast" for c in deferred)
    assert attrs(served)["polygate.verdict"] == "success"
    assert "error.type" not in attrs(served)

    # Each call span is a child of its run's own task span (the instrumentation's).
    runs = []
    for call in calls:
        assert call.parent is not None
        run = by_id[call.parent.span_id]
        assert run.name == f"run/{ask.name}"
        assert run.kind is SpanKind.CONSUMER
        runs.append(run)
    assert len({run.context.span_id for run in runs}) == len(calls)  # one run each

    # Each run after the first links to the call that deferred the one before.
    assert not calls[0].links
    for earlier, later in pairwise(calls):
        (link,) = later.links
        assert link.context.span_id == earlier.context.span_id
        assert link.context.trace_id == earlier.context.trace_id
        assert dict(link.attributes or {}) == {"polygate.link": "deferred_run"}
    assert [attrs(c)["polygate.task.deferrals"] for c in calls] == list(range(len(calls)))

    # A deferral is a span under the call whose verdict deferred the task.
    deferrals = sorted(
        (s for s in spans if s.name == "defer chat"), key=lambda s: s.start_time or 0
    )
    assert len(deferrals) == len(deferred)
    for call, deferral in zip(deferred, deferrals, strict=True):
        assert deferral.parent is not None
        assert deferral.parent.span_id == call.context.span_id
        assert attrs(deferral)["polygate.deferral.reason"] == "fail_fast"
        assert attrs(deferral)["polygate.deferral.strategy"] == "park"

    # The attempt that served is a client span under its call; no prompt anywhere.
    (attempt,) = (s for s in spans if s.kind is SpanKind.CLIENT)
    assert attempt.name == "chat up"
    assert attempt.parent is not None
    assert attempt.parent.span_id == served.context.span_id
    assert "now or later" not in "\n".join(span.to_json() for span in spans)  # the prompt
