"""Edge (observability): the telemetry hook that makes spans of governed calls and deferrals.

It keeps what it needs of a call from its start to its verdict (the span, the
waits by cause, the model that answered) and builds each attempt's span when
the attempt is over, with its measured length; see `polygate_celery.otel`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextvars import Token
from dataclasses import dataclass, field

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from polygate_celery import __version__
from polygate_celery.otel.attributes import (
    OPERATIONS,
    error_type,
    input_messages,
    output_messages,
    provider_of,
    request_params,
    server_attributes,
    usage_attributes,
)
from polygate_celery.otel.links import carry_on, deferral_parent, previous_run_links
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

NS = 1_000_000_000


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
        if event.priority is not None:
            attributes["polygate.priority"] = event.priority
        if event.tenant is not None:  # any tenant: spans are sampled, not aggregated
            attributes["polygate.tenant"] = event.tenant
        run = run_trace.get()
        if run is not None:
            attributes["polygate.task.deferrals"] = run.deferrals
        span = self._tracer.start_span(
            f"{operation} {event.scope}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=previous_run_links(),
        )
        if not span.is_recording():
            return  # no SDK, or not sampled: nothing more to build
        payload = event.payload
        params: dict[str, AttributeValue] = {}
        messages = None
        if isinstance(payload, ChatRequest):
            params = request_params(payload.params)
            if self.include_bodies:
                messages = input_messages(payload.messages)
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
        attributes.update(server_attributes(event.server))
        success = record.outcome == "success"
        if outcome is not None:
            attributes.update(usage_attributes(outcome))
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
                attributes["gen_ai.output.messages"] = output_messages(outcome.value)
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
        carry_on(span)  # a deferral of this run carries on its latest call's context
        try:
            otel_context.detach(call.token)
        finally:
            span.end()

    # -- beside calls ------------------------------------------------------------

    def _deferral(self, event: DeferralEvent) -> None:
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
            context=deferral_parent(),
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
