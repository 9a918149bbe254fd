"""Source layer: the protocol of a model source adapter.

An adapter sends one request to one source and classifies what happened into
an `Outcome` (SPEC §5). It does not retry, wait for permits or sleep between
attempts: that is the governance loop's job.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from polygate_celery.core.outcome import Outcome


@runtime_checkable
class Source(Protocol):
    """A model source adapter: sends one request, classifies what happened.

    It does not retry, wait for permits or sleep between attempts: the
    governance loop does. Pass your own to `Gateway` by source name.
    """

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        """Send `payload` once and classify the result.

        A provider's answer, of any shape, is an outcome, never an exception;
        cancellation passes through.

        Args:
            payload: What the call was given (`Gateway.call`'s `payload`).
            timeout_s: The attempt's total deadline, granted by the loop (the
                source's own `timeout_s`, shortened when the call's
                `max_call_s` is near). A response received at or before it is
                that response; past it, the adapter returns a timed-out
                transient outcome (`Outcome.timeout`).

        Returns:
            The classified attempt: `Outcome.success(value)`,
            `Outcome.rate_limited`, `Outcome.transient`, `Outcome.rejected` or
            `Outcome.fatal`.
        """
        ...


@runtime_checkable
class FirstTokenSource(Source, Protocol):
    """A source that can limit a streamed answer's first token (`ttft_timeout_s`).

    The limit is a failover trigger (SPEC §3 rule 17), so whether it applies is
    the loop's to say, per attempt: it passes ``first_token_limit=False`` on the
    last source left, where the attempt waits for its first token up to
    `timeout_s`. Sources without the limit keep the plain `Source.send`: the
    loop gives this keyword only to a source of this protocol.
    """

    def limits_first_token(self, payload: Any) -> bool:
        """Whether sending `payload` would cut a slow first token (e.g. a streamed
        chat request to a source with a first-token limit): only then does the loop
        judge whether another source could serve the call."""
        ...

    async def send(
        self, payload: Any, *, timeout_s: float, first_token_limit: bool = True
    ) -> Outcome:
        """As `Source.send`; with `first_token_limit` False, no separate limit on the
        first token: `timeout_s` alone bounds the wait for it."""
        ...
