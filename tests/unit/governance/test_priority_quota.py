"""Calls waiting for a source's quota are served by class within the floors (SPEC §8),
whichever store holds the bookings: a saturating batch backlog, then interactive calls
at half the quota and above it, through the gateway on virtual time."""

from __future__ import annotations

import asyncio

import pytest

from polygate_celery import AllSourcesExhausted, Gateway, parse_config
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory

ANSWER_S = 0.3
RPM = 600  # ten slots a second
BATCH_CALLERS = 64
WARMUP_S, HALF_S, ABOVE_S = 30.0, 20.0, 30.0


class Run:
    """Batch calls one after another from 64 callers for the whole run; interactive
    calls at 5 a second (half the quota) for `HALF_S`, then at 15 a second (one and a
    half times the quota) for `ABOVE_S`."""

    def __init__(self, clock: VirtualClock, gateway: Gateway) -> None:
        self.clock, self.gateway = clock, gateway
        self.used: list[tuple[float, str]] = []  # (admitted at, class)
        self.interactive_waits: list[float] = []  # in the first phase
        self.verdicts: list[str] = []

    async def call(self, priority: str) -> None:
        asked = self.clock.now()
        try:
            await self.gateway.chat("s", [{"role": "user", "content": "hi"}], priority=priority)
        except AllSourcesExhausted as exc:
            self.verdicts.append(exc.reason)
            return
        admitted = self.clock.now() - ANSWER_S
        self.used.append((admitted, priority))
        if priority == "interactive" and admitted < WARMUP_S + HALF_S:
            self.interactive_waits.append(admitted - asked)

    async def run(self) -> None:
        end = WARMUP_S + HALF_S + ABOVE_S

        async def batch() -> None:
            while self.clock.now() < end:
                await self.call("batch")

        callers = [asyncio.ensure_future(batch()) for _ in range(BATCH_CALLERS)]
        await self.clock.sleep(WARMUP_S)
        calls = []
        for rate, seconds in ((5, HALF_S), (15, ABOVE_S)):
            for _ in range(int(rate * seconds)):
                calls.append(asyncio.ensure_future(self.call("interactive")))
                await self.clock.sleep(1 / rate)
        await asyncio.gather(*calls, *callers)

    def batch_used(self, start: float, seconds: float) -> tuple[int, int]:
        inside = [c for at, c in self.used if start <= at < start + seconds]
        return sum(1 for c in inside if c == "batch"), len(inside)


@pytest.mark.parametrize("floor", [0.1, 0.25])
async def test_a_higher_class_goes_first_on_a_quota_and_a_lower_keeps_its_floor(
    clock: VirtualClock, gateway: GatewayFactory, floor: float
) -> None:
    config = parse_config(
        {
            "sources": {"a": {"max_concurrency": 8, "timeout_s": 60, "rpm": RPM}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
            "priorities": {"interactive": {}, "batch": {"default": True, "min_share": floor}},
        }
    )
    gw = gateway(config, {"a": ScriptedSource.always(clock, steps.chat("ok", duration_s=ANSWER_S))})
    run = Run(clock, gw)
    await run.run()
    await gw.aclose()
    assert run.verdicts == []
    # at half the quota, an interactive call takes the soonest slot batch booked
    assert max(run.interactive_waits) <= ANSWER_S + 0.5
    # above it, batch keeps its floor of the slots used, to one slot, in every 10 s
    for start in range(int(WARMUP_S + HALF_S), int(WARMUP_S + HALF_S + ABOVE_S), 10):
        batch, used = run.batch_used(start, 10.0)
        assert used == RPM / 6  # the quota used to the full
        assert abs(batch - floor * used) <= 1, (start, batch, used)
