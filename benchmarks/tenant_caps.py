"""Tenants' caps at a source, fleet-wide, counted at the provider.

Run: ``.venv/bin/python benchmarks/tenant_caps.py [--processes 4] [--callers 3]
[--seconds 150] [--label NAME]`` (a private ``redis-server``; the simulator in this
process). Prints a Markdown report; `benchmarks/results/tenant_caps.md` holds the
committed run.

One simulated chat source, ``max_concurrency = 16`` (the provider's capacity too),
answers in 0.2-0.4 s, no quota of its own. Four tenants of equal weight, each of
`processes` worker processes keeping `callers` calls of each waiting, one after
another: a capped at 3 calls in flight, b at 120 requests a minute, c at 30,000 tokens
a minute, d not capped. Their calls cost 100, 200, 1,000 and 300 tokens (as the package
estimates them and as the provider counts them, which tells the tenants apart there).
Everything else is the package's defaults.

At the provider, from its journal (each request's arrival, end and tokens): a's most
requests in flight at once, b's requests and c's tokens against a bucket of their caps
(a minute's burst, as the caps count), and what each tenant was served per minute once
the burst was spent. The targets (issue 38): every cap exact, never exceeded, and used
(b and c at least 95 % of their rate); d served the rest; no 429.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._fleet import (  # noqa: E402
    count_admissions,
    fleet_args,
    ready_then_wait,
    report_on_a_private_redis,
    run_on_simulator,
    tenants_calling,
)

CAP = 16
LATENCY_S = (0.2, 0.4)
CONCURRENCY, RPM, TPM = 3, 120, 30_000
# tenant -> (its caps, tokens a call costs)
TENANTS: dict[str, tuple[dict[str, int], int]] = {
    "a": ({"max_concurrency": CONCURRENCY}, 100),
    "b": ({"rpm": RPM}, 200),
    "c": ({"tpm": TPM}, 1000),
    "d": ({}, 300),
}
USED_TARGET = 0.95
WINDOW_S = 60.0


def config(base_url: str) -> dict[str, Any]:
    return {
        "sources": {
            "sim": {
                "base_url": base_url,
                "model": "caps-model",
                "max_concurrency": CAP,
                "timeout_s": 30,
            }
        },
        "scopes": {"summarise": {"kind": "chat", "sources": ["sim"]}},
        "tenants": {name: caps for name, (caps, _) in TENANTS.items() if caps},
    }


async def worker(spec: dict[str, Any]) -> dict[str, Any]:
    from polygate_celery import Gateway, parse_config  # noqa: PLC0415
    from polygate_celery.store.redis import RedisStore  # noqa: PLC0415

    store = RedisStore.from_url(spec["url"], prefix=spec["prefix"], socket_timeout_s=30)
    counts = count_admissions(store)
    gateway = Gateway(parse_config(config(spec["base_url"])), store=store)
    await ready_then_wait(spec)
    began = time.time()
    tokens = {tenant: cost for tenant, (_, cost) in TENANTS.items()}
    end = began + spec["seconds"]
    verdicts = await tenants_calling(gateway, tokens, spec["callers"], lambda _: end)
    await gateway.aclose()
    return {**counts, "verdicts": verdicts, "began": began}


def served(journal: Any, epoch: float) -> dict[str, list[tuple[float, float, int]]]:
    """Each tenant's requests the provider served: (arrival, end, tokens), epoch seconds,
    the tenant told by what its calls cost."""
    by_cost = {cost: tenant for tenant, (_, cost) in TENANTS.items()}
    found: dict[str, list[tuple[float, float, int]]] = {tenant: [] for tenant in TENANTS}
    for entry in journal:
        if entry.outcome == "ok":
            tokens = entry.prompt_tokens + entry.completion_tokens
            found[by_cost[tokens]].append((entry.at + epoch, entry.ended + epoch, tokens))
    return {tenant: sorted(requests) for tenant, requests in found.items()}


def most_in_flight(requests: list[tuple[float, float, int]]) -> int:
    """The most requests in flight at once at the provider (arrival to end)."""
    events = sorted([(at, 1) for at, _, _ in requests] + [(end, -1) for _, end, _ in requests])
    level = peak = 0
    for _, step in events:  # (an end sorts before an arrival at the same instant)
        level += step
        peak = max(peak, level)
    return peak


def worst_over(arrivals: list[tuple[float, int]], per_minute: int) -> float:
    """How far (seconds of refill) the arrivals went over a bucket of `per_minute` units
    with a minute's burst, at worst (<= 0: never over)."""
    tat, worst = 0.0, -60.0
    for at, units in arrivals:
        charge = min(units, per_minute) * 60.0 / per_minute
        worst = max(worst, max(tat - at, 0.0) + charge - 60.0)
        tat = max(tat, at) + charge
    return worst


async def run(url: str, args: argparse.Namespace) -> str:
    from polygate_celery.testing.simulator import ModelBehaviour  # noqa: PLC0415

    spec = {
        "prefix": f"caps-{uuid.uuid4().hex[:8]}",
        "processes": args.processes,
        "callers": args.callers,
        "seconds": args.seconds,
    }
    behaviour = ModelBehaviour(capacity=CAP, latency_s=LATENCY_S)
    ran = await run_on_simulator(__file__, url, "caps-model", behaviour, spec, args.processes)
    began = ran.began
    requests = served(ran.journal, ran.epoch)
    # after the buckets' first burst: whole minutes from the end of the first one
    steady = [(began + WINDOW_S * k, WINDOW_S) for k in range(1, int(args.seconds // WINDOW_S))]
    if not steady:  # a short run: what follows its first half
        steady = [(began + args.seconds / 2, args.seconds / 2)]

    def per_minute(tenant: str, tokens: bool) -> list[float]:
        return [
            sum(n if tokens else 1 for at, _, n in requests[tenant] if s <= at < s + length)
            * 60.0
            / length
            for s, length in steady
        ]

    a_peak = most_in_flight(requests["a"])
    b_over = worst_over([(at, 1) for at, _, _ in requests["b"]], RPM)
    c_over = worst_over([(at, n) for at, _, n in requests["c"]], TPM)
    b_rates, c_rates = per_minute("b", False), per_minute("c", True)
    d_rates = per_minute("d", False)
    windows = ", ".join(f"{s - began:.0f}-{s - began + n:.0f} s" for s, n in steady)
    lines = [
        f"# Tenants' caps at a source, at the provider ({args.label})",
        "",
        f"{args.processes} worker processes x {args.callers} calls waiting per tenant; source "
        f"cap {CAP} (the provider's too), answers in {LATENCY_S[0]}-{LATENCY_S[1]} s, no "
        f"quota; {args.seconds:.0f} s. Tenant a capped at {CONCURRENCY} calls in flight, b at "
        f"{RPM} requests a minute, c at {TPM:,} tokens a minute, d not capped; calls of 100, "
        f"200, 1,000 and 300 tokens. Counted from the provider's journal. Python "
        f"{sys.version.split()[0]}, a private redis-server.",
        "",
        f"| tenant | cap | at the provider | worst against the cap | per minute after the "
        f"first ({windows}) |",
        "|---|---|---|---|---|",
        f"| a | {CONCURRENCY} in flight | {len(requests['a']):,} requests | most in flight "
        f"{a_peak} | {' / '.join(f'{r:,.0f}' for r in per_minute('a', False))} requests |",
        f"| b | {RPM} rpm | {len(requests['b']):,} requests | {b_over:+.3f} s of refill "
        f"(<= 0: never over) | {' / '.join(f'{r:,.1f}' for r in b_rates)} requests |",
        f"| c | {TPM:,} tpm | {sum(n for _, _, n in requests['c']):,} tokens | {c_over:+.3f} s "
        f"of refill | {' / '.join(f'{r:,.0f}' for r in c_rates)} tokens |",
        f"| d | none | {len(requests['d']):,} requests | - | "
        f"{' / '.join(f'{r:,.0f}' for r in d_rates)} requests |",
        "",
        ran.summary(),
    ]
    failed: list[str] = []
    if a_peak != CONCURRENCY:
        failed.append(f"a had {a_peak} in flight at most, its cap is {CONCURRENCY}")
    if b_over > 1e-3 or c_over > 1e-3:
        failed.append(f"over a rate cap: b {b_over:+.3f} s, c {c_over:+.3f} s")
    if min(b_rates) < USED_TARGET * RPM or min(c_rates) < USED_TARGET * TPM:
        failed.append("a rate cap was not used: " + ", ".join(map(str, b_rates + c_rates)))
    if not requests["d"]:
        failed.append("d was not served")
    if ran.refusals:
        failed.append(f"{ran.refusals} provider refusals")
    if failed:
        lines += ["", "**FAILED**: " + "; ".join(failed)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--callers", type=int, default=3, help="per tenant, per process")
    parser.add_argument("--seconds", type=float, default=150.0)
    args = fleet_args(parser, worker)
    if args is None:
        return
    report_on_a_private_redis(lambda url: run(url, args), "a target missed (see the report)")


if __name__ == "__main__":
    main()
