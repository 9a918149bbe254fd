"""Sources whose health depends on the virtual time, for outage and failover tests."""

from __future__ import annotations

from typing import Any

from polygate_celery.core.outcome import Outcome
from polygate_celery.testing import VirtualClock


class DownBetween:
    """Answers 503 while ``start <= now < end``, serves otherwise, after `latency_s`.

    `sent` records every request: (virtual time it arrived, whether the source was up).
    """

    def __init__(
        self, clock: VirtualClock, start: float, end: float, *, latency_s: float = 0.0
    ) -> None:
        self.clock, self.start, self.end, self.latency_s = clock, start, end, latency_s
        self.sent: list[tuple[float, bool]] = []

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        up = not self.start <= self.clock.now() < self.end
        self.sent.append((self.clock.now(), up))
        await self.clock.sleep(self.latency_s)
        if not self.start <= self.clock.now() < self.end:
            return Outcome.success(payload)
        return Outcome.transient("service unavailable", status=503)
