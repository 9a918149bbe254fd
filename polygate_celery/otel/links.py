"""Edge (observability): a task's trace carried across its deferrals (W3C trace context).

A deferral's message carries the context of the call whose verdict deferred the
task (`RunTrace.latest`, set when that call ends); the deferral's own span is a
child of that call, and the calls of the task's next run link back to it. The
W3C propagator is used whatever the application's global propagator is, since
the carrier is ours on both ends.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from polygate_celery.telemetry import run_trace

TRACE_CONTEXT = TraceContextTextMapPropagator()  # W3C, whatever the global propagator is


def previous_run_links() -> list[Link]:
    """A link to the call that deferred the running task's previous run, if there was one."""
    run = run_trace.get()
    if run is None or not run.previous:
        return []
    previous = _span_context(run.previous)
    if previous is None:
        return []
    return [Link(previous, {"polygate.link": "deferred_run"})]


def carry_on(span: Span) -> None:
    """Make `span`'s context the one a deferral of the running task carries on."""
    run = run_trace.get()
    if run is not None:
        carrier: dict[str, str] = {}
        TRACE_CONTEXT.inject(carrier, context=trace.set_span_in_context(span))
        run.latest = carrier


def deferral_parent() -> Context | None:
    """The context of the call whose verdict defers the running task, if it had one."""
    run = run_trace.get()
    return TRACE_CONTEXT.extract(run.latest) if run is not None and run.latest else None


def _span_context(carrier: Mapping[str, str]) -> trace.SpanContext | None:
    context = TRACE_CONTEXT.extract(dict(carrier))
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None
