"""A provider that counts its quota in 60 s windows, met with no window declared (virtual
time).

The provider is the simulator's own model of one (`Admission`, rate_limiter "window":
at most rpm requests in any 60 s, a truthful Retry-After on each 429), and its answers
carry the rate-limit headers the simulator sends (OpenAI's style), read as the adapters
read them. Its resets show the window, and requests then follow it: after the first
window's requests, none is refused. A bucket declared over what is learned (``rpm_window
= "bucket"``) is honoured, and meets the provider's 429s.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.classify import rate_limits
from polygate_celery.testing import VirtualClock
from polygate_celery.testing.simulator import ModelBehaviour
from polygate_celery.testing.simulator.admission import Admission
from polygate_celery.testing.simulator.server import ratelimit_headers
from tests.conftest import GatewayFactory, make_config

RPM = 20
CALLS = 50  # three windows: 20, 20, 10
IN_FLIGHT = 4
LATENCY_S = 0.2


class WindowProvider:
    """The simulator's window-counting provider, answering on the virtual clock."""

    def __init__(self, clock: VirtualClock, limiter: str = "window") -> None:
        self.clock = clock
        self.admission = Admission(ModelBehaviour(rpm=RPM, rate_limiter=limiter))  # type: ignore[arg-type]
        self.served: list[float] = []
        self.refused: list[float] = []

    def _limits(self) -> Any:
        return rate_limits(ratelimit_headers("openai", self.admission.limits(self.clock.now())))

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        now = self.clock.now()
        refusal = self.admission.admit(now, 0)
        if refusal is not None:
            self.refused.append(now)
            retry_after = math.ceil(refusal.retry_after_s)  # whole seconds, as the server sends
            return Outcome.rate_limited(retry_after, limits=self._limits())
        self.served.append(now)
        try:
            await self.clock.sleep(LATENCY_S)
        finally:
            self.admission.release()
        return Outcome.success(payload, limits=self._limits())


def _config(**source: Any) -> Any:
    settings = {"max_concurrency": IN_FLIGHT, "timeout_s": 10.0, **source}
    return make_config("chat", {"a": settings}, stall_window_s=300.0)


async def _run(gw: Any) -> None:
    limit = asyncio.Semaphore(IN_FLIGHT)

    async def one(n: int) -> None:
        async with limit:
            await gw.call("s", f"p{n}")

    await asyncio.gather(*(one(n) for n in range(CALLS)))


@pytest.mark.parametrize("declared", [{}, {"rpm": RPM}], ids=["undeclared", "rpm-declared"])
async def test_a_window_provider_is_followed_without_a_window_declared(
    clock: VirtualClock, gateway: GatewayFactory, declared: dict[str, Any]
) -> None:
    provider = WindowProvider(clock)
    gw = gateway(_config(**declared), {"a": provider})
    await _run(gw)
    assert len(provider.served) == CALLS
    first_window_ends = provider.served[0] + 60.0
    late = [at for at in provider.refused if at >= first_window_ends]
    assert late == [], f"refused past the first window at {late}"
    # Each later window is taken whole at its start: three windows, about two minutes.
    assert clock.now() < 2 * 60.0 + 10.0


async def test_a_declared_bucket_is_honoured_over_the_windows_shown(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    provider = WindowProvider(clock)
    gw = gateway(_config(rpm=RPM, rpm_window="bucket"), {"a": provider})
    await _run(gw)
    assert len(provider.served) == CALLS
    assert any(at >= provider.served[0] + 60.0 for at in provider.refused)


async def test_a_bucket_provider_keeps_its_even_refill(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    provider = WindowProvider(clock, limiter="bucket")
    gw = gateway(_config(), {"a": provider})
    await _run(gw)
    assert len(provider.served) == CALLS
    # 20 at once, then one every 3 s: 30 more in about 90 s, not three windows' two minutes.
    assert clock.now() < 100.0
    assert len(provider.refused) <= 2
