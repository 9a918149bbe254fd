"""Redis unreachable mid-run: calls fail closed, nothing goes out unleased, and it recovers."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

from polygate_celery import Gateway, GovernanceBackendError, Outcome, parse_config
from polygate_celery.store.redis import RedisStore
from tests.integration.witness import Witness, WitnessClient
from tests.redis_server import RedisServer

LEASE_S, SOCKET_TIMEOUT_S, CAP = 3.0, 2.0, 2


LONG_MS = 20_000.0  # a request far longer than the lease: only a cancelled attempt ends sooner


class WitnessSource:
    """Requests of 20-200 ms, but a payload of "long" holds for `LONG_MS`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.clients: dict[int, WitnessClient] = {}
        self.rng = random.Random(1)
        self.long_sent = asyncio.Event()

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        client = self.clients.setdefault(id(asyncio.current_task()), WitnessClient(self.port))
        if payload == "long":
            self.long_sent.set()
        await client.hold(LONG_MS if payload == "long" else self.rng.uniform(20, 200))
        return Outcome.success("ok")


@dataclass
class Load:
    """Callers making governed calls back to back, every call's (start, end, verdict) kept."""

    gateway: Gateway
    calls: list[tuple[float, float, str]] = field(default_factory=list)
    running: bool = True
    served: list[tuple[float, str | None, str | None]] = field(default_factory=list)

    async def caller(
        self, payload: str = "x", priority: str | None = None, tenant: str | None = None
    ) -> None:
        while self.running:
            started = time.monotonic()
            try:
                await self.gateway.call("s", payload, priority=priority, tenant=tenant)
                verdict = "success"
                self.served.append((started, priority, tenant))
            except GovernanceBackendError:
                verdict = "backend_error"
                await asyncio.sleep(0.05)
            self.calls.append((started, time.monotonic(), verdict))

    def between(self, start: float, end: float) -> list[tuple[float, float, str]]:
        return [c for c in self.calls if start <= c[0] < end]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(persistent=True) as server:
        yield server


@pytest_asyncio.fixture
async def witness() -> AsyncIterator[Witness]:
    witness = await Witness().start()
    yield witness
    await witness.stop()


# Classes and tenants (SPEC §8): callers of both classes, of three tenants, by turns.
CLASSES = {
    "priorities": {"interactive": {}, "batch": {"default": True, "min_share": 0.1}},
    "tenants": {"a": {"weight": 1}, "b": {"weight": 2}, "c": {"weight": 5}},
}


async def run_load(
    server: RedisServer,
    witness: Witness,
    disturb: Any,
    callers: int = 6,
    classes: bool = False,
) -> tuple[Load, dict[str, float]]:
    config = parse_config(
        {
            "sources": {"w": {"max_concurrency": CAP, "timeout_s": 30}},
            "scopes": {"s": {"kind": "embedding", "sources": ["w"], "poll_interval_s": 0.1}},
            **(CLASSES if classes else {}),
        }
    )
    store = RedisStore.from_url(server.url, lease_s=LEASE_S, socket_timeout_s=SOCKET_TIMEOUT_S)
    source = WitnessSource(witness.port)
    load = Load(Gateway(config, {"w": source}, store=store))
    standings = itertools.cycle(
        itertools.product(["interactive", "batch"], "abc") if classes else [(None, None)]
    )
    tasks = [asyncio.ensure_future(load.caller("x", *next(standings))) for _ in range(callers)]
    # in flight when Redis goes (of the class served first, when there are classes)
    long_standing = ("interactive", "a") if classes else (None, None)
    tasks.append(asyncio.ensure_future(load.caller("long", *long_standing)))
    try:
        # Redis goes while the long request is in flight, however slowly it was admitted.
        await asyncio.wait_for(source.long_sent.wait(), timeout=30.0)
        await asyncio.sleep(1.0)
        marks = await disturb()
        await asyncio.sleep(4.0)  # time to recover
    finally:
        await stop(load, tasks, store, source)
    return load, marks


async def stop(
    load: Load, tasks: Sequence[asyncio.Future[None]], store: RedisStore, source: WitnessSource
) -> None:
    """The callers finish their calls in flight; the store and the witness's clients close."""
    load.running = False
    await asyncio.gather(*tasks)
    await store.aclose()
    for client in source.clients.values():
        client.close()


async def crash_and_restart(server: RedisServer) -> dict[str, float]:
    """SIGKILL Redis, and start it again 4 s later on its port and data directory
    (appendfsync always): when it went down and came back up."""
    down = time.monotonic()
    server.kill()
    await asyncio.sleep(4.0)
    server.start()
    return {"down": down, "up": time.monotonic()}


def assert_fails_closed_and_recovers(load: Load, witness: Witness, down: float, up: float) -> None:
    # Calls that began while Redis was away, early enough not to be answered once it was back.
    during = load.between(down + 0.05, up - SOCKET_TIMEOUT_S - 0.1)
    assert during, "no call was made while Redis was unreachable"
    assert {verdict for _, _, verdict in during} == {"backend_error"}
    slowest = max(end - start for start, end, _ in during)
    print(f"{len(during)} calls failed closed while Redis was away; slowest {slowest:.2f} s")
    assert slowest <= SOCKET_TIMEOUT_S + 0.5
    # No request started at the source without a live lease: none while Redis was away,
    # and the ones in flight when it went (the long one among them, which would have
    # run 20 s) were cut before their leases could expire.
    assert not [start for start, _, _ in witness.spans if down + 0.05 < start < up]
    cut = [(start, end, hold) for start, end, hold in witness.spans if start < down < end]
    assert any(hold > LEASE_S for _, _, hold in cut), "the long request was not in flight"
    assert all(end <= down + LEASE_S for _, end, _ in cut), (down, cut)
    assert witness.peak <= CAP
    after = [verdict for start, _, verdict in load.calls if start >= up + 2.5]
    assert after, "no call after Redis came back"
    assert set(after) == {"success"}, "the same process did not recover"


async def test_redis_paused_longer_than_the_lease(server: RedisServer, witness: Witness) -> None:
    async def pause() -> dict[str, float]:
        down = time.monotonic()
        server.pause()
        await asyncio.sleep(LEASE_S + 2)
        server.resume()
        return {"down": down, "up": time.monotonic()}

    load, marks = await run_load(server, witness, pause)
    assert_fails_closed_and_recovers(load, witness, marks["down"], marks["up"])


async def test_redis_crashed_and_restarted(server: RedisServer, witness: Witness) -> None:
    load, marks = await run_load(server, witness, lambda: crash_and_restart(server))
    assert_fails_closed_and_recovers(load, witness, marks["down"], marks["up"])


async def test_redis_crashed_and_restarted_with_classes_and_tenants(
    server: RedisServer, witness: Witness
) -> None:
    """As above, with priority classes (a floor) and weighted tenants: the queues, tags
    and credits in Redis go with it and come back from its log; no call goes out while
    it is away, the cap holds, and every class and tenant is served afterwards."""

    load, marks = await run_load(
        server, witness, lambda: crash_and_restart(server), callers=12, classes=True
    )
    assert_fails_closed_and_recovers(load, witness, marks["down"], marks["up"])
    after = {(priority, tenant) for start, priority, tenant in load.served if start >= marks["up"]}
    assert after == set(itertools.product(["interactive", "batch"], "abc")), after


async def test_script_flush_mid_run_fails_no_call(server: RedisServer, witness: Witness) -> None:
    async def flush() -> dict[str, float]:
        client = RedisStore.from_url(server.url).client
        for _ in range(5):
            await client.script_flush()
            await asyncio.sleep(0.2)
        await client.aclose()
        return {}

    load, _ = await run_load(server, witness, flush)
    assert len(load.calls) > 50
    assert {verdict for _, _, verdict in load.calls} == {"success"}


RPM = 120  # a bucket: a minute's requests at once, then two a second


async def run_quota_load(
    server: RedisServer, witness: Witness, disturb: Any
) -> tuple[Load, dict[str, float]]:
    """Three callers of each of three tenants (weighted 1:2:5) at a source of `RPM`; Redis
    is disturbed once the bucket's burst is spent and the callers wait for its slots."""
    config = parse_config(
        {
            "sources": {"w": {"max_concurrency": CAP, "timeout_s": 30, "rpm": RPM}},
            "scopes": {"s": {"kind": "embedding", "sources": ["w"], "poll_interval_s": 0.1}},
            "tenants": CLASSES["tenants"],
        }
    )
    store = RedisStore.from_url(server.url, lease_s=LEASE_S, socket_timeout_s=SOCKET_TIMEOUT_S)
    source = WitnessSource(witness.port)
    load = Load(Gateway(config, {"w": source}, store=store))
    tasks = [asyncio.ensure_future(load.caller("x", None, t)) for t in "abc" * 3]
    try:
        async with asyncio.timeout(120):
            # the burst spent: the callers book slots (the witness keeps no event)
            while len(witness.spans) < RPM + 4:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        marks = await disturb()
        await asyncio.sleep(8.0)  # time to recover: 16 slots
    finally:
        await stop(load, tasks, store, source)
    return load, marks


async def test_redis_crashed_and_restarted_with_tenants_booked_on_a_quota(
    server: RedisServer, witness: Witness
) -> None:
    """Callers of three tenants wait for a quota's slots, booked ahead and placed by their
    tags, when Redis is SIGKILLed and restarted: the bookings, tags and buckets come back
    from its log, no request goes out while it is away, none goes over the quota (the
    witness's starts against the provider's bucket), and every tenant is served
    afterwards."""

    load, marks = await run_quota_load(server, witness, lambda: crash_and_restart(server))
    down, up = marks["down"], marks["up"]
    during = load.between(down + 0.05, up - SOCKET_TIMEOUT_S - 0.1)
    assert during, "no call was made while Redis was unreachable"
    assert {verdict for _, _, verdict in during} == {"backend_error"}
    assert not [start for start, _, _ in witness.spans if down + 0.05 < start < up]
    tat = 0.0  # the provider's bucket: RPM a minute, a minute's burst
    for start in sorted(start for start, _, _ in witness.spans):
        over = max(tat - start, 0.0) + 60.0 / RPM - 60.0
        assert over <= 0.25, f"a request {over:.2f} s over the quota"
        tat = max(tat, start) + 60.0 / RPM
    served = {tenant for at, _, tenant in load.served if at >= up}
    assert served == set("abc"), load.served[-20:]


class TenantWitnessSource(WitnessSource):
    """As `WitnessSource`, each tenant's requests held at a witness of its own (the payload
    names the tenant: "<tenant>" or "<tenant>-long")."""

    def __init__(self, ports: dict[str, int]) -> None:
        super().__init__(0)
        self.ports = ports

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        tenant, _, long = str(payload).partition("-")
        key = (id(asyncio.current_task()), tenant)
        client = self.clients.setdefault(hash(key), WitnessClient(self.ports[tenant]))
        if long:
            self.long_sent.set()
        await client.hold(LONG_MS if long else self.rng.uniform(20, 200))
        return Outcome.success("ok")


TENANT_CAPS = {"a": 1, "b": 2}  # calls in flight at the source, of its 4


async def test_redis_crashed_and_restarted_with_tenants_at_their_caps(
    server: RedisServer, witness: Witness
) -> None:
    """Callers of two capped tenants keep the source busy when Redis is SIGKILLed and
    restarted: each tenant's record of its permits comes back from the log with the
    source's, and lapses with their leases; no request goes out while Redis is away, no
    tenant is ever over its cap at the source (a witness of its own each), and both are
    served afterwards."""
    witness_b = await Witness().start()
    config = parse_config(
        {
            "sources": {"w": {"max_concurrency": 4, "timeout_s": 30}},
            "scopes": {"s": {"kind": "embedding", "sources": ["w"], "poll_interval_s": 0.1}},
            "tenants": {name: {"max_concurrency": cap} for name, cap in TENANT_CAPS.items()},
        }
    )
    store = RedisStore.from_url(server.url, lease_s=LEASE_S, socket_timeout_s=SOCKET_TIMEOUT_S)
    source = TenantWitnessSource({"a": witness.port, "b": witness_b.port})
    load = Load(Gateway(config, {"w": source}, store=store))
    tasks = [asyncio.ensure_future(load.caller(t, None, t)) for t in "aaabbb"]
    tasks.append(asyncio.ensure_future(load.caller("b-long", None, "b")))
    try:
        await asyncio.wait_for(source.long_sent.wait(), timeout=30.0)
        await asyncio.sleep(1.0)
        marks = await crash_and_restart(server)
        down, up = marks["down"], marks["up"]
        await asyncio.sleep(4.0)
    finally:
        await stop(load, tasks, store, source)
        await witness_b.stop()
    during = load.between(down + 0.05, up - SOCKET_TIMEOUT_S - 0.1)
    assert during, "no call was made while Redis was unreachable"
    assert {verdict for _, _, verdict in during} == {"backend_error"}
    for each in (witness, witness_b):
        assert not [start for start, _, _ in each.spans if down + 0.05 < start < up]
    cut = [hold for start, end, hold in witness_b.spans if start < down < end]
    assert any(hold > LEASE_S for hold in cut), "the long request was not in flight"
    assert (witness.peak, witness_b.peak) == (TENANT_CAPS["a"], TENANT_CAPS["b"])
    served = {tenant for at, _, tenant in load.served if at >= up}
    assert served == {"a", "b"}, load.served[-20:]
