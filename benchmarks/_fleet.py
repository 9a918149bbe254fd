"""The fleet benchmarks' harness: worker processes started together on one private Redis.

Each benchmark script runs itself as its worker (``<script> --worker SPEC``): the worker
builds its store and gateway, counts its admissions (`count_admissions`), says it is
ready and waits for the go (`ready_then_wait`), runs, and prints one JSON line. The
harness (`run_fleet`) starts them, waits until all are ready (start-up is not timed),
resets Redis's statistics, gives the go, and reads what they printed, Redis's command
counts and its CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

HARNESS_TIMEOUT_S = 660.0  # the harness waits for slow starters (redis-py 8's default: 5 s)

# The harness's own commands (and the workers' ready, go and work list), not governance.
HARNESS_COMMANDS = frozenset({"info", "config|resetstat", "rpush", "blpop", "decr"})


def count_admissions(
    store: Any, on_grant: Callable[[Any, Any], None] | None = None
) -> dict[str, int]:
    """Count `store`'s admit calls and grants (calling `on_grant(request, grant)` on each)."""
    from polygate_celery.store import Grant  # noqa: PLC0415

    counts = {"admits": 0, "granted": 0}
    admit = store.admit

    async def counted(request: Any) -> Any:
        answer = await admit(request)
        counts["admits"] += 1
        if isinstance(answer, Grant):
            counts["granted"] += 1
            if on_grant is not None:
                on_grant(request, answer)
        return answer

    store.admit = counted
    return counts


def count_waits(
    store: Any,
    on_grant: Callable[[Any, Any, float], None],
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, int]:
    """Count `store`'s admissions (`count_admissions`) and time each call's wait for a
    permit, from its first ask to its grant: `on_grant(request, grant, wait_s)`."""
    first_ask: dict[str, float] = {}

    def granted(request: Any, grant: Any) -> None:
        on_grant(request, grant, clock() - first_ask.pop(request.call_id))

    counts = count_admissions(store, granted)
    asked = store.admit

    async def first_asked(request: Any) -> Any:
        first_ask.setdefault(request.call_id, clock())
        return await asked(request)

    store.admit = first_asked
    return counts


async def ready_then_wait(spec: dict[str, Any]) -> None:
    """Tell the harness this worker is ready, then wait for its go."""
    from polygate_celery.store.redis import redis_client  # noqa: PLC0415

    client = redis_client(spec["url"], socket_timeout_s=600, connect_timeout_s=60)
    await client.rpush(spec["ready"], "1")
    await client.blpop([spec["go"]], timeout=600)
    await client.aclose()


@dataclass(frozen=True)
class FleetRun:
    results: list[dict[str, Any]]  # what each worker printed
    elapsed_s: float  # from the go to the last worker's end
    redis_cpu_s: float
    commands: dict[str, int]  # governance commands Redis ran, by name (scripts' own too)

    @property
    def total_commands(self) -> int:
        return sum(self.commands.values())


async def run_fleet(
    script: str,
    url: str,
    spec: dict[str, Any],
    processes: int,
    before_go: Callable[[Any], None] | None = None,
) -> FleetRun:
    """Run `processes` workers of `script` with `spec` (plus its url, ready and go keys);
    `before_go(client)` prepares Redis once all are ready. The spec's prefix's keys are
    removed afterwards."""
    import redis  # noqa: PLC0415

    run_id = uuid.uuid4().hex[:8]
    spec = {**spec, "url": url, "ready": f"bench:{run_id}:ready", "go": f"bench:{run_id}:go"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYGATE_")}
    children = [  # (each told its place in the fleet: `index`)
        await asyncio.create_subprocess_exec(
            sys.executable,
            script,
            "--worker",
            json.dumps({**spec, "index": index}),
            stdout=subprocess.PIPE,
            env=env,
        )
        for index in range(processes)
    ]
    with redis.Redis.from_url(
        url, decode_responses=True, socket_timeout=HARNESS_TIMEOUT_S
    ) as client:
        for _ in range(processes):
            client.blpop([spec["ready"]], timeout=600)
        if before_go is not None:
            before_go(client)
        client.config_resetstat()
        cpu_before = client.info("cpu")
        began = time.perf_counter()
        client.rpush(spec["go"], *["go"] * processes)
        outputs = [await child.communicate() for child in children]
        elapsed = time.perf_counter() - began
        cpu_after = client.info("cpu")
        stats = client.info("commandstats")
        client.delete(spec["ready"], spec["go"])
        for key in client.scan_iter(match=f"{{{spec['prefix']}}}*"):
            client.delete(key)
    results = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]
    commands = {
        name: int(value["calls"])
        for key, value in stats.items()
        if (name := key.removeprefix("cmdstat_")) not in HARNESS_COMMANDS
    }
    redis_cpu = sum(
        float(cpu_after[k]) - float(cpu_before[k]) for k in ("used_cpu_sys", "used_cpu_user")
    )
    return FleetRun(results, elapsed, redis_cpu, commands)


@dataclass(frozen=True)
class SimulatedRun:
    """A fleet's run against one simulated model: the fleet's figures, and the provider's
    journal (its clock, seconds since it started, is `epoch` in epoch seconds)."""

    fleet: FleetRun
    journal: list[Any]
    epoch: float

    @property
    def began(self) -> float:
        """When the first worker began (epoch seconds)."""
        return min(r["began"] for r in self.fleet.results)

    @property
    def refusals(self) -> int:
        """The provider's 429s."""
        return sum(1 for e in self.journal if e.outcome.startswith("429"))

    def summary(self) -> str:
        """The workers' verdicts, the provider's 429s and what an acquisition cost."""
        results = self.fleet.results
        verdicts = sum((Counter(r["verdicts"]) for r in results), Counter())
        refused = sum(r["admits"] - r["granted"] for r in results)
        grants = max(1, sum(r["granted"] for r in results))
        return (
            f"Verdicts: {dict(sorted(verdicts.items()))}; provider 429s {self.refusals}; refused "
            f"admissions per acquisition {refused / grants:.2f}; Redis commands per "
            f"acquisition {self.fleet.total_commands / grants:.1f}, Redis CPU per acquisition "
            f"{1000 * self.fleet.redis_cpu_s / grants:.2f} ms."
        )


async def run_on_simulator(
    script: str, url: str, model: str, behaviour: Any, spec: dict[str, Any], processes: int
) -> SimulatedRun:
    """`run_fleet` with a simulated provider of `model` (`behaviour`), its URL in the spec
    (``base_url``)."""
    from polygate_celery.testing.simulator import SimulatedProvider  # noqa: PLC0415

    with SimulatedProvider({model: behaviour}) as provider:
        fleet = await run_fleet(script, url, {**spec, "base_url": provider.url}, processes)
        journal = provider.journal
        epoch = time.time() - provider.since_start()
    return SimulatedRun(fleet, journal, epoch)


ANSWER_TOKENS = 4  # the simulator's answer, "simulated answer": max_tokens asks for it


def messages(tokens: int) -> list[dict[str, str]]:
    """A prompt the package estimates, and the simulator counts, at `tokens` with its answer."""
    return [{"role": "user", "content": "x" * 4 * (tokens - ANSWER_TOKENS)}]


async def tenants_calling(
    gateway: Any,
    tokens: dict[str, int],
    callers: int,
    until: Callable[[str], float],
    served: Callable[[str], None] | None = None,
) -> dict[str, int]:
    """`callers` callers per tenant (`tokens`: each one's call size) each making chat calls
    in scope "summarise", one after another, until `until(tenant)` (epoch seconds);
    `served(tenant)` after each success. The verdicts, counted."""
    from polygate_celery import AllSourcesExhausted  # noqa: PLC0415

    verdicts: Counter[str] = Counter()

    async def caller(tenant: str) -> None:
        while time.time() < until(tenant):
            try:
                await gateway.chat(
                    "summarise", messages(tokens[tenant]), tenant=tenant, max_tokens=ANSWER_TOKENS
                )
                verdicts["success"] += 1
                if served is not None:
                    served(tenant)
            except AllSourcesExhausted as exc:
                verdicts[exc.reason] += 1

    await asyncio.gather(*(caller(t) for t in tokens for _ in range(callers)))
    return dict(verdicts)


def chat_config(base_url: str, model: str, cap: int, rpm: int) -> dict[str, Any]:
    """One simulated chat source with the package's defaults but a cap and an rpm (the
    default bucket), and one scope, "summarise", on it."""
    return {
        "sources": {
            "sim": {
                "base_url": base_url,
                "model": model,
                "max_concurrency": cap,
                "rpm": rpm,
                "timeout_s": 30,
            }
        },
        "scopes": {"summarise": {"kind": "chat", "sources": ["sim"]}},
    }


def bucket_provider(
    model: str,
    cap: int,
    rpm: int,
    latency_s: tuple[float, float],
    errors: float = 0.0,
    headers: str = "none",
) -> Any:
    """A simulated provider serving `model` with a cap and an rpm it counts as a token
    bucket, answering in `latency_s`, `errors` of the requests with a 503, announcing its
    limits in `headers` ("openai", "anthropic" or "none") (a context manager; its ``url``
    and ``journal``)."""
    from polygate_celery.testing.simulator import (  # noqa: PLC0415
        ModelBehaviour,
        SimulatedProvider,
    )

    behaviour = ModelBehaviour(
        capacity=cap,
        rpm=rpm,
        rate_limiter="bucket",
        latency_s=latency_s,
        error_rates={503: errors} if errors else {},
        ratelimit_headers=headers,  # type: ignore[arg-type]
    )
    return SimulatedProvider({model: behaviour})


def fleet_args(
    parser: argparse.ArgumentParser, worker: Callable[[dict[str, Any]], Any]
) -> argparse.Namespace | None:
    """`parser`'s arguments, with ``--label`` and the worker's ``--worker``; None when
    this process ran as a worker (`act_as_worker`)."""
    parser.add_argument("--label", default="this commit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return None if act_as_worker(args.worker, worker) else args


def act_as_worker(spec_json: str | None, worker: Callable[[dict[str, Any]], Any]) -> bool:
    """Run `worker` on `spec_json` (the ``--worker`` argument) and print its JSON line, if
    this process was started as a worker; else False."""
    if not spec_json:
        return False
    print(json.dumps(asyncio.run(worker(json.loads(spec_json)))), flush=True)
    return True


def report_on_a_private_redis(report: Callable[[str], Awaitable[str]], failed: str) -> None:
    """Print what `report` makes of a run against a private ``redis-server`` (its URL
    given), and exit with `failed` if the report says **FAILED**."""
    from tests.redis_server import RedisServer  # noqa: PLC0415

    with RedisServer() as server:
        text = asyncio.run(report(server.url))
    print(text)
    if "**FAILED**" in text:
        raise SystemExit(failed)


def plot_axes(ylabel: str, title: str) -> tuple[Any, Any] | None:
    """A 9 x 4 figure and its axes, seconds along, `ylabel` up, for a benchmark's plot;
    None (said on stderr) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib is not installed (pip install '.[bench]'): no plot", file=sys.stderr)
        return None
    figure, axis = plt.subplots(figsize=(9, 4))
    axis.set_xlabel("seconds")
    axis.set_ylabel(ylabel)
    axis.set_title(title, fontsize=10)
    return figure, axis


def save_plot(figure: Any, axis: Any, path: Any) -> None:
    """Write the plot (`plot_axes`'s) to `path`, with its legend, and free it."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
