"""A worker process of the test fleet: governed calls through a RedisStore.

Run as ``python -m tests.integration.fleet_worker '<json spec>'``; prints one JSON
line with what happened. Modes:

* ``witness``: `callers` concurrent callers each make `calls` governed calls whose
  source holds the witness for 0-`hold_ms` ms (`hold_ms` exactly with `hold_exact`);
* ``counter``: the source does an unguarded read-increment-write of a Redis key
  (not a governance key): only the permit protects it;
* ``hold``: one call whose source never answers, so its permit is held (and its
  lease renewed) until the process dies;
* ``status``: one call with a scripted outcome (``ok`` or ``429:<retry_after>``),
  or a `fail_fast` call, for fleet-semantics checks;
* ``ordered``: one call whose source appends `name` to the Redis list `order_key`
  (after waiting, with `hold_key`, until the test pushes to that key).

Every result counts the process's admissions: asked (`admits`) and granted.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

from polygate_celery import (
    AllSourcesExhausted,
    Gateway,
    GovernanceBackendError,
    Outcome,
    parse_config,
)
from polygate_celery.store import Grant
from polygate_celery.store.redis import RedisStore, redis_client
from tests.integration.witness import WitnessClient


class WitnessSource:
    def __init__(self, port: int, hold_ms: float, rng: random.Random, exact: bool) -> None:
        self.clients: dict[int, WitnessClient] = {}
        self.port, self.hold_ms, self.rng, self.exact = port, hold_ms, rng, exact

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        task_id = id(asyncio.current_task())
        client = self.clients.setdefault(task_id, WitnessClient(self.port))
        await client.hold(self.hold_ms if self.exact else self.rng.uniform(0, self.hold_ms))
        return Outcome.success("ok")


class CounterSource:
    def __init__(self, url: str, key: str, rng: random.Random) -> None:
        self.redis = redis_client(url)
        self.key, self.rng = key, rng

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        value = int(await self.redis.get(self.key) or 0)
        await asyncio.sleep(self.rng.uniform(0, 0.002))  # widen the race window
        await self.redis.set(self.key, value + 1)
        return Outcome.success(value + 1)


class ForeverSource:
    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        print(json.dumps({"holding": True}), flush=True)
        await asyncio.sleep(3600)
        return Outcome.success("never")


class OrderedSource:
    """Records the order in which calls across the fleet got their permit."""

    def __init__(self, url: str, spec: dict[str, Any]) -> None:
        self.redis = redis_client(url, socket_timeout_s=130)
        self.spec = spec

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        if self.spec.get("hold_key"):
            print(json.dumps({"holding": True}), flush=True)
            await self.redis.blpop([self.spec["hold_key"]], timeout=120)
        await self.redis.rpush(self.spec["order_key"], self.spec["name"])
        return Outcome.success("ok")


class StatusSource:
    def __init__(self, step: str) -> None:
        self.step, self.sent = step, 0

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        self.sent += 1
        if self.step.startswith("429:"):
            return Outcome.rate_limited(float(self.step[4:]))
        return Outcome.success("ok")


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    config = parse_config(
        {
            "sources": {
                name: {
                    "max_concurrency": spec["cap"],
                    "timeout_s": spec.get("timeout_s", 30),
                    **({"rpm": spec["rpm"]} if spec.get("rpm") else {}),
                }
                for name in spec.get("sources", ["w"])
            },
            "scopes": {
                "s": {
                    "kind": spec.get("kind", "embedding"),
                    "sources": spec.get("sources", ["w"]),
                    "poll_interval_s": spec.get("poll_interval_s", 0.1),
                    "stall_window_s": spec.get("stall_window_s", 300),
                    "max_attempts": spec.get("max_attempts", 3),
                }
            },
            **({"priorities": spec["priorities"]} if spec.get("priorities") else {}),
        }
    )
    store = RedisStore.from_url(spec["redis_url"], prefix=spec["prefix"], lease_s=spec["lease_s"])
    rng = random.Random(spec.get("seed", 0))
    mode = spec["mode"]
    source: Any
    if mode == "witness":
        source = WitnessSource(
            spec["witness_port"], spec["hold_ms"], rng, spec.get("hold_exact", False)
        )
    elif mode == "counter":
        source = CounterSource(spec["redis_url"], spec["counter_key"], rng)
    elif mode == "hold":
        source = ForeverSource()
    elif mode == "ordered":
        source = OrderedSource(spec["redis_url"], spec)
    else:
        source = StatusSource(spec.get("step", "ok"))
    gateway = Gateway(config, dict.fromkeys(spec.get("sources", ["w"]), source), store=store)
    admissions = {"admits": 0, "granted": 0}
    admit = store.admit

    async def counted_admit(request: Any) -> Any:
        answer = await admit(request)
        admissions["admits"] += 1
        admissions["granted"] += isinstance(answer, Grant)
        return answer

    store.admit = counted_admit  # type: ignore[method-assign]
    outcomes: dict[str, int] = {}
    if spec.get("go_key"):  # ready, then wait for the test's go (start-up is not timed)
        client = redis_client(spec["redis_url"], socket_timeout_s=130)  # above the BLPOP's 120 s
        await client.rpush(spec["ready_key"], "1")
        await client.blpop([spec["go_key"]], timeout=120)
        await client.aclose()
    started = time.monotonic()

    async def caller() -> None:
        for i in range(spec.get("calls", 1)):
            if i and spec.get("pace_s"):
                await asyncio.sleep(spec["pace_s"])
            try:
                fail_fast, priority = spec.get("fail_fast", False), spec.get("priority")
                await gateway.call("s", "x", fail_fast=fail_fast, priority=priority)
                verdict = "success"
            except AllSourcesExhausted as exc:
                verdict = exc.reason
                outcomes["retry_after_s"] = round(exc.retry_after_s)
            except GovernanceBackendError:
                verdict = "backend_error"
            outcomes[verdict] = outcomes.get(verdict, 0) + 1

    await asyncio.gather(*(caller() for _ in range(spec.get("callers", 1))))
    result = {"outcomes": outcomes, "seconds": time.monotonic() - started, **admissions}
    if isinstance(source, StatusSource):
        result["sent"] = source.sent
    await store.aclose()
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
