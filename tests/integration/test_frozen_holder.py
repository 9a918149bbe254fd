"""A paid answer whose permit lease lapsed mid-attempt is returned (SPEC §3 rule 14), on Redis.

A lease that is gone fences nothing any more: its permit may be another call's
already. The attempt runs on and its answer is kept; what that costs is the cap,
exceeded by that one request while it lasts, which the witness (a server that
counts requests in flight, knowing nothing of Redis) measures here.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
from typing import Any

import pytest

from polygate_celery import Gateway, Outcome, parse_config
from polygate_celery.store.redis import RedisStore
from tests.conftest import Figures
from tests.integration.conftest import result_of, spawn_worker
from tests.integration.fleet_worker import WitnessSource
from tests.integration.witness import Witness

LEASE_S = 2.0
FROZEN_S = 2 * LEASE_S + 1  # well past the lease, however busy the machine


def config() -> Any:
    return parse_config(
        {
            "sources": {"w": {"max_concurrency": 1, "timeout_s": 30}},
            "scopes": {"s": {"kind": "embedding", "sources": ["w"], "poll_interval_s": 0.05}},
        }
    )


class LapsingSource:
    """The call "first" has its permit's lease vanish from Redis while it is at the
    provider (as when it runs out); a "second" call is then admitted, and "first" is
    answered after a renewal has found its lease gone. "second" holds until the test
    lets it go."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.gateway: Gateway | None = None
        self.second: asyncio.Future[Any] | None = None
        self.second_started = asyncio.Event()
        self.let_second_go = asyncio.Event()
        self.in_flight = self.peak = 0

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if payload == "second":
                self.second_started.set()
                await self.let_second_go.wait()
                return Outcome.success("second")
            assert self.gateway is not None
            await asyncio.sleep(0.1)
            await self.store.client.delete(self.store.keys.permits("w"))
            self.second = asyncio.ensure_future(self.gateway.call("s", "second"))
            await asyncio.wait_for(self.second_started.wait(), 30)
            await asyncio.sleep(LEASE_S)  # a renewal (every third of a lease) finds it gone
            return Outcome.success("paid")
        finally:
            self.in_flight -= 1


async def test_a_success_whose_lease_vanished_mid_attempt_is_returned(
    redis_url: str, fleet_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix, lease_s=LEASE_S)
    source = LapsingSource(store)
    gateway = source.gateway = Gateway(config(), {"w": source}, store=store)
    try:
        with caplog.at_level(logging.WARNING, logger="polygate_celery"):
            result = await gateway.call("s", "first")

        assert result.value == "paid"
        lapsed = [r.getMessage() for r in caplog.records if "lapsed" in r.getMessage()]
        assert len(lapsed) == 1
        assert all(text in lapsed[0] for text in ("'s'", "'w'", "no longer held"))
        assert source.peak == 2  # the cap, exceeded by the lapsed request
        # Settled as the store allows: progress marked, the second call's permit its own.
        assert await store.progress_age_s("s") < 5
        assert (await gateway.snapshot("s"))[0].permits_in_use == 1
        source.let_second_go.set()
        assert source.second is not None
        assert (await source.second).value == "second"
        assert (await gateway.snapshot("s"))[0].permits_in_use == 0
    finally:
        source.let_second_go.set()
        await gateway.aclose()
        await store.aclose()


@pytest.mark.parametrize(
    "hold_s",
    [
        pytest.param(FROZEN_S - 1, id="answered-while-frozen"),
        pytest.param(FROZEN_S + 2, id="answered-after-it-resumed"),
    ],
)
async def test_a_holder_frozen_past_its_lease_keeps_its_paid_answer(
    redis_url: str, fleet_prefix: str, figures: Figures, hold_s: float
) -> None:
    """Cap 1. A worker process is SIGSTOPped with its request at the provider, for
    `FROZEN_S` (its lease is `LEASE_S`); two callers of this process meanwhile call back
    to back. The frozen request is answered `hold_s` after it began, and the worker,
    resumed, must return it: a success, the request never cut. The witness then shows
    the cap exceeded by exactly that request (never 3 in flight), from its lease's lapse
    until the provider answered it."""
    witness = await Witness().start()
    spec = {
        "mode": "witness",
        "redis_url": redis_url,
        "prefix": fleet_prefix,
        "cap": 1,
        "lease_s": LEASE_S,
        "witness_port": witness.port,
        "hold_ms": hold_s * 1000,
        "hold_exact": True,
    }
    frozen = await spawn_worker(spec)
    source = WitnessSource(witness.port, 200, random.Random(0), exact=True)
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix, lease_s=LEASE_S)
    others = Gateway(config(), {"w": source}, store=store)
    running = True

    async def caller() -> None:
        while running:
            await others.call("s", "x")

    callers: list[asyncio.Future[None]] = []
    try:
        started = time.monotonic()
        while witness.in_flight == 0:  # its request is at the provider
            assert time.monotonic() - started < 60, "the worker never sent its request"
            await asyncio.sleep(0.005)
        frozen.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        callers = [asyncio.ensure_future(caller()) for _ in range(2)]
        await asyncio.sleep(FROZEN_S)
        frozen.send_signal(signal.SIGCONT)
        result = await result_of(frozen, 120)
    finally:
        running = False
        await asyncio.gather(*callers)
        await others.aclose()
        await store.aclose()
        for client in source.clients.values():
            client.close()
        await witness.stop()

    assert result["outcomes"] == {"success": 1}, result
    [(begun, ended, _)] = [span for span in witness.spans if span[2] == hold_s]
    assert ended - begun >= hold_s - 0.05  # answered, never cut short
    assert witness.peak == 2  # the frozen request beside the cap's one, no more
    overlap = sum(
        max(0.0, min(end, ended) - max(start, begun))
        for start, end, hold in witness.spans
        if hold != hold_s
    )
    assert 0 < overlap <= ended - stopped
    figures(
        f"holder frozen {FROZEN_S:g} s past a {LEASE_S:g} s lease, its request answered "
        f"{hold_s:g} s after it began: success returned; 2 requests in flight for "
        f"{overlap:.2f} s (from the lease's lapse until the provider answered)"
    )
