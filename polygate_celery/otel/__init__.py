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
  attributes: scope, priority class and tenant, source, attempts, stall time,
  waits by cause, the task's deferrals so far.
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

try:
    import opentelemetry.trace  # noqa: F401 - the extra's one package, checked once here
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the module
    raise ImportError(
        "polygate_celery.otel needs opentelemetry-api: pip install 'polygate_celery[otel]'"
    ) from exc

from polygate_celery.otel.attributes import (
    DEFAULT_PROVIDER,
    OPERATIONS,
    PROVIDER_HOSTS,
    REQUEST_PARAMS,
    error_type,
    provider_of,
)
from polygate_celery.otel.hook import NS, OpenTelemetryHook
from polygate_celery.otel.links import TRACE_CONTEXT

__all__ = [
    "DEFAULT_PROVIDER",
    "NS",
    "OPERATIONS",
    "PROVIDER_HOSTS",
    "REQUEST_PARAMS",
    "TRACE_CONTEXT",
    "OpenTelemetryHook",
    "error_type",
    "provider_of",
]
