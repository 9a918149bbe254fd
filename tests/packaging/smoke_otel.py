"""Run in a virtualenv with `polygate_celery[otel]` and the OpenTelemetry SDK (the
application's, as a user installs it): a governed call makes its spans."""

from __future__ import annotations

import stub_provider
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from polygate_celery.otel import OpenTelemetryHook

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

source = {"base_url": stub_provider.serve(), "model": "stub"}
text = stub_provider.ask(source, hooks=[OpenTelemetryHook()])
assert text == stub_provider.REPLY, text
spans = {span.name: span for span in exporter.get_finished_spans()}
assert set(spans) == {"chat chat", "chat stub"}, sorted(spans)
attempt = dict(spans["chat stub"].attributes or {})
assert attempt["gen_ai.usage.output_tokens"] == 3, attempt
assert spans["chat stub"].parent.span_id == spans["chat chat"].context.span_id
print(f"otel spans: {', '.join(sorted(spans))}")
