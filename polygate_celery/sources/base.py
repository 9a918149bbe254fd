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
    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        """Send `payload` once and classify the result.

        `timeout_s` is the attempt's total deadline, granted by the loop (the
        source's own `timeout_s`, shortened when the call's `max_call_s` is near).
        A response received at or before it is that response; past it, the
        adapter returns a timed-out transient outcome. A provider's answer, of
        any shape, is an outcome, never an exception; cancellation passes
        through.
        """
        ...
