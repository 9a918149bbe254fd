"""Governed calls against a Redis topology whose master is killed mid-run.

`run_failover` drives callers making governed calls back to back through a
`Gateway` on a `RedisStore` of the given configuration, to a witness that
counts requests in flight at the source; kills a master (SIGKILL); waits
(polling, off the event loop) until a replica is promoted; and goes on for a
while. `assert_failover` checks what the acceptance asks: calls fail closed
while no master answers (never granted without Redis), calls succeed again
after the promotion without a restart, and the witness never sees more than
the cap.

No failover can complete before the master has been unreachable for the
topology's detection time (1 s for both fixtures), so every call that began in
the first `BLIND_S` after the kill met no master: each of them must fail closed.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from polygate_celery import Gateway, GovernanceBackendError, Outcome, parse_config
from polygate_celery.config.models import StoreConfig
from polygate_celery.store.redis import RedisStore
from tests.integration.witness import Witness, WitnessClient
from tests.redis_topologies import DOWN_AFTER_MS

LEASE_S, SOCKET_TIMEOUT_S, CAP, CALLERS = 3.0, 2.0, 4, 16
BLIND_S = DOWN_AFTER_MS / 1000 - 0.5  # before the topology calls its master down
AFTER_S = LEASE_S + 4.0  # run on after the promotion: old leases lapse, calls recover


class WitnessSource:
    def __init__(self, port: int) -> None:
        self.port = port
        self.clients: dict[int, WitnessClient] = {}
        self.rng = random.Random(1)

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        client = self.clients.setdefault(id(asyncio.current_task()), WitnessClient(self.port))
        await client.hold(self.rng.uniform(20, 120))
        return Outcome.success("ok")

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


@dataclass
class Load:
    gateway: Gateway
    calls: list[tuple[float, float, str]] = field(default_factory=list)
    running: bool = True

    async def caller(self) -> None:
        while self.running:
            started = time.monotonic()
            try:
                await self.gateway.call("s", "x")
                verdict = "success"
            except GovernanceBackendError:
                verdict = "backend_error"
                await asyncio.sleep(0.05)
            self.calls.append((started, time.monotonic(), verdict))

    def between(self, start: float, end: float) -> list[tuple[float, float, str]]:
        return [c for c in self.calls if start <= c[0] < end]


@dataclass
class Failover:
    load: Load
    witness: Witness
    down: float
    promoted: float


def gateway_config() -> Any:
    return parse_config(
        {
            "sources": {"w": {"max_concurrency": CAP, "timeout_s": 30}},
            "scopes": {"s": {"kind": "embedding", "sources": ["w"], "poll_interval_s": 0.1}},
        }
    )


async def run_failover(
    store_config: StoreConfig, kill: Callable[[RedisStore], Any], promote: Callable[[Any], Any]
) -> Failover:
    """`kill(store)` kills the master of the store's keys and returns what `promote(it)`
    needs to wait for its replica's promotion (both blocking: they run in a thread)."""
    config = store_config.model_copy(
        update={"lease_s": LEASE_S, "socket_timeout_s": SOCKET_TIMEOUT_S}
    )
    witness = await Witness().start()
    store = RedisStore.from_config(config, groups_of=gateway_config())
    source = WitnessSource(witness.port)
    load = Load(Gateway(gateway_config(), {"w": source}, store=store))
    tasks = [asyncio.ensure_future(load.caller()) for _ in range(CALLERS)]
    try:
        await asyncio.sleep(2.0)
        assert any(v == "success" for _, _, v in load.calls), "no call succeeded before"
        down = time.monotonic()
        killed = await asyncio.to_thread(kill, store)
        await asyncio.to_thread(promote, killed)
        promoted = time.monotonic()
        await asyncio.sleep(AFTER_S)
    finally:
        load.running = False
        await asyncio.gather(*tasks)
        await load.gateway.aclose()
        await store.aclose()
        source.close()
        await witness.stop()
        # The dead master's connections: their transports closed when it went away, but
        # redis-py drops their stream writers without closing them, and each warns when
        # collected, in whichever later test that happens. Collected here, with that
        # warning ignored (the sockets are closed already).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
    return Failover(load, witness, down, promoted)


def _crowded(run: Failover) -> str:
    """The spans at the source in flight together beyond the cap, in seconds from the
    kill, and when the replica was promoted: a failing run's message."""
    spans = sorted(run.witness.spans)
    for start, _, _ in spans:
        together = [s for s in spans if s[0] <= start < s[1]]
        if len(together) > CAP:
            shown = ", ".join(
                f"{a - run.down:+.3f}..{b - run.down:+.3f} (hold {h * 1000:.0f} ms)"
                for a, b, h in together
            )
            return f"promoted at {run.promoted - run.down:+.3f}; in flight together: {shown}"
    return "no moment of the spans recorded shows it (a span still open at the end?)"


def assert_failover(run: Failover) -> str:
    """The acceptance's checks; a line of figures for the report."""
    load, witness = run.load, run.witness
    blind = load.between(run.down + 0.05, run.down + BLIND_S)
    assert blind, "no call was made while no master answered"
    assert {verdict for _, _, verdict in blind} == {"backend_error"}, "granted without Redis"
    slowest = max(end - start for start, end, _ in blind)
    assert slowest <= SOCKET_TIMEOUT_S + 1.0, f"a call took {slowest:.2f} s to fail closed"
    started = [t for t, _, _ in witness.spans if run.down + 0.05 < t < run.down + BLIND_S]
    assert not started, f"{len(started)} requests reached the source while no master answered"
    assert witness.peak <= CAP, (
        f"the witness saw {witness.peak} in flight, cap {CAP}: {_crowded(run)}"
    )
    late = [v for start, _, v in load.calls if start >= run.promoted + LEASE_S + 1.0]
    assert late, "no call after the promotion"
    assert set(late) == {"success"}, "calls did not recover after the promotion"
    failed = [c for c in load.calls if c[0] >= run.down and c[2] == "backend_error"]
    first_ok = min(
        (start for start, _, v in load.calls if start >= run.down and v == "success"),
        default=float("nan"),
    )
    return (
        f"{len(load.calls)} calls; {len(failed)} failed closed after the kill "
        f"({len(blind)} begun in the first {BLIND_S} s, none reaching the source, slowest "
        f"{slowest:.2f} s); promotion seen "
        f"{run.promoted - run.down:.1f} s after the kill; first success after it "
        f"{first_ok - run.down:.1f} s; witness peak {witness.peak} (cap {CAP}); "
        f"{len(late)} calls after the leases lapsed, all successes"
    )
