"""Testing: `ScriptedSource`, a source adapter that plays a script of per-attempt steps.

Each attempt takes the next step: what the source does and for how long, on
the gateway's clock. A step that would outlast the attempt's deadline ends at
the deadline as a timeout; a step that ends exactly at the deadline is the
step's own answer (a 429 at exactly `timeout_s` is a 429).

A source given `ttft_timeout_s` plays a streaming source with a first-token
limit: an attempt whose first token (`first_token_s`, else the step's whole
answer) comes later than the limit ends at the limit, as the HTTP adapter's
does, unless the loop lifts the limit for that attempt (on the last source left).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from polygate_celery.clock import Clock
from polygate_celery.core.outcome import Outcome, OutcomeKind
from polygate_celery.sources.payloads import ChatResult, EmbeddingResult, OcrResult

StepKind = Literal[
    "ok", "rate_limited", "timeout", "server_error", "fatal", "source_rejected", "auth_rejected"
]


class ScriptExhausted(AssertionError):
    """The source was asked for more attempts than its script has."""


@dataclass(frozen=True, slots=True)
class Step:
    """One scripted attempt. Build steps with the functions below."""

    kind: StepKind
    duration_s: float = 0.0
    value: Any = None
    retry_after_s: float | None = None
    status: int | None = None
    reason: str | None = None
    tokens: int | None = None
    first_token_s: float | None = None  # a streamed answer's first token (None: the answer's)


def ok(value: Any = "ok", *, duration_s: float = 0.0, tokens: int | None = None) -> Step:
    """A success answering `value` after `duration_s`, reporting `tokens` used."""
    return Step("ok", duration_s, value=value, tokens=tokens)


def chat(text: str, *, finish_reason: str = "stop", duration_s: float = 0.0) -> Step:
    """A chat answer, as ``calls.chat(...).value`` reads it (`ChatResult`)."""
    return ok(ChatResult(text, finish_reason), duration_s=duration_s)


def embedding(vectors: list[list[float]], *, duration_s: float = 0.0) -> Step:
    """Embeddings, as ``calls.embed(...).value`` reads them (`EmbeddingResult`)."""
    return ok(EmbeddingResult(vectors), duration_s=duration_s)


def ocr(text: str, *, duration_s: float = 0.0) -> Step:
    """A page's text, as ``calls.ocr(...).value`` reads it (`OcrResult`)."""
    return ok(OcrResult(text), duration_s=duration_s)


def streamed(value: Any = "ok", *, first_token_s: float, duration_s: float | None = None) -> Step:
    """A streamed answer whose first token comes `first_token_s` after sending, whole
    `duration_s` after sending (default: with its first token)."""
    whole_s = first_token_s if duration_s is None else max(duration_s, first_token_s)
    return Step("ok", whole_s, value=value, first_token_s=first_token_s)


def stuck_first_token() -> Step:
    """A stream whose first token never comes: cut by a first-token limit, or held for
    the attempt's whole deadline, then a timeout."""
    return Step("timeout", float("inf"), first_token_s=float("inf"))


def rate_limited(*, duration_s: float = 0.0, retry_after_s: float | None = None) -> Step:
    """A 429, with a Retry-After of `retry_after_s` if given."""
    return Step("rate_limited", duration_s, retry_after_s=retry_after_s, status=429)


def timeout() -> Step:
    """Hold the request for the attempt's whole deadline, then time out."""
    return Step("timeout", float("inf"))


def server_error(*, duration_s: float = 0.0, status: int = 500) -> Step:
    """A transient failure (a 5xx): retried, counted by the breaker."""
    return Step("server_error", duration_s, status=status, reason="server error")


def fatal(reason: str = "bad request", *, duration_s: float = 0.0, status: int = 400) -> Step:
    """A request no source can serve: the call ends with `SourceFatalError`."""
    return Step("fatal", duration_s, status=status, reason=reason)


def source_rejected(
    reason: str = "context length exceeded", *, duration_s: float = 0.0, status: int = 400
) -> Step:
    """A request this source cannot serve but another might: the call fails over."""
    return Step("source_rejected", duration_s, status=status, reason=reason)


def auth_rejected(*, duration_s: float = 0.0, status: int = 401) -> Step:
    """Credentials rejected: the source is paused fleet-wide and an alert is emitted."""
    return Step("auth_rejected", duration_s, status=status, reason="credentials rejected")


def _outcome(step: Step) -> Outcome:
    if step.kind == "ok":
        return Outcome(
            OutcomeKind.SUCCESS, value=step.value, status=200, completion_tokens=step.tokens
        )
    if step.kind == "rate_limited":
        return Outcome.rate_limited(step.retry_after_s)
    if step.kind == "server_error":
        return Outcome.transient(step.reason or "server error", status=step.status)
    if step.kind == "fatal":
        return Outcome.fatal(step.reason or "fatal", status=step.status)
    if step.kind == "source_rejected":
        return Outcome.rejected(step.reason or "rejected", status=step.status)
    if step.kind == "auth_rejected":
        return Outcome.rejected(
            step.reason or "credentials rejected", status=step.status, credentials_rejected=True
        )
    raise AssertionError(f"unhandled step {step.kind}")


@dataclass
class Sent:
    """One request the source saw (its journal entry)."""

    at: float
    payload: Any
    timeout_s: float
    step: Step
    outcome: Outcome | None = None
    ttft_s: float | None = None  # the first-token limit this attempt had (None: none)


@dataclass
class ScriptedSource:
    """A `Source` that plays `steps`, one per attempt, on `clock`.

    Use `ScriptedSource.always()` for a source that always does the same thing.

    Attributes:
        clock: The gateway's clock: each step takes its time on it.
        steps: One step per attempt, in order; may be infinite
            (``itertools.repeat(rate_limited())``). An attempt past the last
            raises `ScriptExhausted`.
        journal: Every request, with the outcome it got (None if cancelled).
        ttft_timeout_s: Every attempt is a stream with this first-token limit
            (a `polygate_celery.sources.base.FirstTokenSource`).
    """

    clock: Clock
    steps: Iterable[Step]
    journal: list[Sent] = field(default_factory=list)
    ttft_timeout_s: float | None = None
    _iter: Iterator[Step] | None = field(default=None, init=False, repr=False)

    @classmethod
    def always(
        cls, clock: Clock, step: Step, *, ttft_timeout_s: float | None = None
    ) -> ScriptedSource:
        """A source that does `step` at every attempt."""
        return cls(clock, itertools.repeat(step), ttft_timeout_s=ttft_timeout_s)

    @property
    def attempts(self) -> int:
        """Requests it has seen."""
        return len(self.journal)

    def limits_first_token(self, payload: Any) -> bool:
        return self.ttft_timeout_s is not None

    async def send(
        self, payload: Any, *, timeout_s: float, first_token_limit: bool = True
    ) -> Outcome:
        if self._iter is None:
            self._iter = iter(self.steps)
        try:
            step = next(self._iter)
        except StopIteration:
            raise ScriptExhausted(f"script exhausted after {self.attempts} attempt(s)") from None
        ttft_s = self.ttft_timeout_s if first_token_limit else None
        sent = Sent(self.clock.now(), payload, timeout_s, step, ttft_s=ttft_s)
        self.journal.append(sent)
        first_token_s = step.duration_s if step.first_token_s is None else step.first_token_s
        if ttft_s is not None and first_token_s > ttft_s and ttft_s < timeout_s:
            await self.clock.sleep(ttft_s)
            sent.outcome = Outcome.timeout(
                "no first token within ttft_timeout_s", first_token_cut=True
            )
        elif step.duration_s > timeout_s:
            await self.clock.sleep(timeout_s)
            sent.outcome = Outcome.timeout()
        else:
            await self.clock.sleep(step.duration_s)
            sent.outcome = _outcome(step)
        return sent.outcome
