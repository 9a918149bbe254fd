"""Edge (CLI): `polygate-celery status`, the fleet's governance state at a glance.

Per scope: the age of its last success and its gate; per source: permits in
use, the adaptive (AIMD) limit and the cap, breaker, pause and quota use; where
classes are declared, each class's waiters; each tenant's calls in flight (against
its cap), waiting and booked; then the Celery parking lots. ``--watch`` redraws
until Ctrl-C, on one connection.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from asyncio import sleep

from polygate_celery.cli.context import (
    add_config_option,
    known,
    load,
    seconds_argument,
    shared_store,
    store_address,
)
from polygate_celery.cli.errors import Commands
from polygate_celery.cli.status_report import (
    ScopeReading,
    SourceReading,
    StatusReading,
    read_status,
)
from polygate_celery.cli.tables import amount, duration, table
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.errors import ConfigError
from polygate_celery.store.base import SourceSnapshot
from polygate_celery.store.redis import RedisStore

DEFAULT_WATCH_S = 2.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def add_command(commands: Commands) -> None:
    parser = commands.add_parser(
        "status",
        help="show permits, limits, breakers, pauses, quotas, the calls of each class and "
        "tenant, and parked tasks",
    )
    add_config_option(parser)
    parser.add_argument(
        "--watch",
        nargs="?",
        type=_interval,
        const=DEFAULT_WATCH_S,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {DEFAULT_WATCH_S:g}) until Ctrl-C",
    )
    parser.add_argument(
        "--app",
        metavar="NAME",
        help="the Celery app's main name whose parked tasks to count "
        "(default: every app's lot under the key prefix)",
    )
    parser.add_argument(
        "--scope", action="append", metavar="NAME", help="show only this scope (repeatable)"
    )
    parser.set_defaults(run=run)


_interval = seconds_argument("the interval must be at least 0.1 s", at_least=0.1)


def run(args: argparse.Namespace) -> int:
    config = load(args.config)
    scopes = [known(s, config.scopes, "scope") for s in args.scope or config.scopes]
    try:
        asyncio.run(_show(config, scopes, args.app, args.watch))
    except KeyboardInterrupt:
        if args.watch is None:
            raise
        print()
    return 0


async def _show(
    config: GatewayConfig, scopes: list[str], app: str | None, every_s: float | None
) -> None:
    async with shared_store(config, "status") as store:
        tty = sys.stdout.isatty()
        while True:
            reading = await read_status(store, config, scopes, app)
            text = render(reading, store, config)
            if every_s is None:
                print(text)
                return
            footer = f"every {every_s:g}s, Ctrl-C to stop"
            print(f"{CLEAR_SCREEN if tty else ''}{text}\n\n{footer}\n", flush=True)
            await sleep(every_s)


def render(reading: StatusReading, store: RedisStore, config: GatewayConfig) -> str:
    """The reading as plain text tables (no colours: it may go to a file or a pipe)."""
    where = store_address(config.store)[0]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    parts = [f"polygate-celery status  redis {where}  prefix {store.keys.prefix}  {stamp}"]
    if not reading.scopes:
        parts.append("no scopes configured")
    else:
        parts.append(_scopes_table(reading.scopes))
        parts.append(_sources_table(reading.scopes))
        if config.priorities:
            parts.append(_classes_table(reading.scopes, list(config.priorities)))
        if any(source.state.tenants for scope in reading.scopes for source in scope.sources):
            parts.append(_tenants_table(reading.scopes, config))
    parts.append(_lots_table(reading))
    return "\n\n".join(parts)


def _scopes_table(scopes: tuple[ScopeReading, ...]) -> str:
    rows = [
        [
            s.name,
            s.kind,
            "none in 1h" if math.isinf(s.progress_age_s) else f"{duration(s.progress_age_s)} ago",
            f"closed {duration(s.gate_closed_for_s)}" if s.gate_closed_for_s > 0 else "open",
        ]
        for s in scopes
    ]
    return table(["SCOPE", "KIND", "LAST SUCCESS", "GATE"], rows, numeric=set())


def _sources_table(scopes: tuple[ScopeReading, ...]) -> str:
    rows = []
    for scope in scopes:
        for i, source in enumerate(scope.sources):
            state = source.state
            rows.append(
                [
                    scope.name if i == 0 else "",
                    state.name,
                    str(state.permits_in_use),
                    str(state.permit_limit),
                    str(source.cap),
                    state.breaker,
                    str(state.breaker_failures),
                    duration(state.paused_for_s) if state.paused_for_s > 0 else "-",
                    _quota_use(source, state),
                ]
            )
    headers = ["SCOPE", "SOURCE", "IN USE", "LIMIT", "CAP", "BREAKER", "FAILS", "PAUSED", "QUOTA"]
    return table(headers, rows, numeric={2, 3, 4, 6})


def _classes_table(scopes: tuple[ScopeReading, ...], classes: list[str]) -> str:
    """Per source, each class's calls waiting for its permits, its calls holding a quota
    slot booked ahead, and its share of the recent grants (the counters behind the
    permits' floors, where floors are declared)."""
    rows = []
    seen: set[str] = set()
    for scope in scopes:
        for source in scope.sources:
            state = source.state
            if state.name in seen:
                continue
            seen.add(state.name)
            total = sum(state.recent_grants)
            for rank, name in enumerate(classes):
                waiting = state.waiting[rank] if rank < len(state.waiting) else 0
                grants = state.recent_grants[rank] if rank < len(state.recent_grants) else 0.0
                share = f"{100 * grants / total:.0f}%" if total > 0 else "-"
                booked = state.booked[rank] if rank < len(state.booked) else 0
                name_cell = state.name if rank == 0 else ""
                rows.append([name_cell, name, str(waiting), str(booked), share])
    headers = ["SOURCE", "CLASS", "WAITING", "BOOKED", "RECENT GRANTS"]
    return table(headers, rows, numeric={2, 3, 4})


# Tenants shown per source, the busiest first (tenants may be customer ids: thousands).
TENANT_ROWS = 20


def _tenants_table(scopes: tuple[ScopeReading, ...], config: GatewayConfig) -> str:
    """Per source, each tenant with calls there: in flight (against its cap, where it has
    one), waiting for its permits, holding a quota slot booked ahead."""
    rows = []
    seen: set[str] = set()
    for scope in scopes:
        for source in scope.sources:
            state = source.state
            if state.name in seen or not state.tenants:
                continue
            seen.add(state.name)
            busiest = sorted(state.tenants, key=lambda t: (-(t.in_flight + t.waiting), t.tenant))
            for i, tenant in enumerate(busiest[:TENANT_ROWS]):
                cap = _concurrency_cap(config, tenant.tenant)
                in_flight = f"{tenant.in_flight}/{cap}" if cap else str(tenant.in_flight)
                name = state.name if i == 0 else ""
                rows.append(
                    [name, tenant.tenant, in_flight, str(tenant.waiting), str(tenant.booked)]
                )
            if len(busiest) > TENANT_ROWS:
                rows.append(["", f"(+{len(busiest) - TENANT_ROWS} more)", "", "", ""])
    return table(["SOURCE", "TENANT", "IN FLIGHT", "WAITING", "BOOKED"], rows, numeric={2, 3, 4})


def _concurrency_cap(config: GatewayConfig, tenant: str) -> int | None:
    """The tenant's cap on calls in flight at a source, if it has one."""
    try:
        caps = config.standing(tenant=tenant).caps
    except ConfigError:  # (not a tenant a call could name: no cap)
        return None
    return caps.max_concurrency if caps is not None else None


def _quota_use(source: SourceReading, state: SourceSnapshot) -> str:
    announced = [
        f"{amount(limit)} {label}"
        for label, limit in (("rpm", state.learned_rpm), ("tpm", state.learned_tpm))
        if limit is not None
    ]
    learned = f"announced {', '.join(announced)}" if announced else ""
    use = source.quota
    if use is None:
        return learned or "-"
    parts = []
    for label, used, limit in (
        ("rpm", use.requests_used, source.rpm),
        ("tpm", use.tokens_used, source.tpm),
    ):
        if used is not None and limit is not None:
            parts.append(f"{label} {amount(used)}/{amount(limit)} {100 * used / limit:.0f}%")
    shared = use.name.removeprefix("shared:")
    where = f" ({shared})" if shared != use.name else ""
    return ", ".join(parts) + where + (f"; {learned}" if learned else "")


def _lots_table(reading: StatusReading) -> str:
    if not reading.lots:
        return "parked tasks: none"
    rows = [[lot.app, str(lot.parked), str(lot.due), str(lot.dead)] for lot in reading.lots]
    headers = ["PARKED (APP@BROKER)", "ENTRIES", "DUE NOW", "DEAD LETTERS"]
    return table(headers, rows, numeric={1, 2, 3})
