"""Edge (CLI): `polygate-celery source pause|resume|reset NAME`, an operator's hand on a source.

Each acts fleet-wide on the configured Redis store, at once: every worker's
next admission sees it. `pause` keeps a later pause already set (a provider's
Retry-After), `resume` lifts any pause, `reset` also closes the breaker and
puts the adaptive limit back to its initial value. Permits held stay held, and
the rate limits the provider announced are kept (they are forgotten an hour
after its last announcement).
"""

from __future__ import annotations

import argparse
import asyncio

from polygate_celery.cli.context import (
    add_config_option,
    known,
    load,
    seconds_argument,
    shared_store,
)
from polygate_celery.cli.errors import Commands
from polygate_celery.cli.tables import duration
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.governance.plan import source_terms
from polygate_celery.store.base import SourceSnapshot

NAME_HELP = "the source's name in the configuration"


def add_command(commands: Commands) -> None:
    parser = commands.add_parser("source", help="pause, resume or reset a source fleet-wide")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    pause = actions.add_parser("pause", help="stop admitting calls to NAME for SECONDS")
    pause.add_argument("name", metavar="NAME", help=NAME_HELP)
    pause.add_argument("seconds", metavar="SECONDS", type=_seconds, help="how long, in seconds")
    resume = actions.add_parser("resume", help="lift NAME's pause")
    resume.add_argument("name", metavar="NAME", help=NAME_HELP)
    reset = actions.add_parser(
        "reset", help="clear NAME's breaker, adaptive limit (back to its initial value) and pause"
    )
    reset.add_argument("name", metavar="NAME", help=NAME_HELP)
    for action in (pause, resume, reset):
        add_config_option(action)
        action.set_defaults(run=run)


_seconds = seconds_argument("SECONDS must be a positive number")


def run(args: argparse.Namespace) -> int:
    config = load(args.config)
    name = known(args.name, config.sources, "source")
    print(asyncio.run(_act(config, args.action, name, getattr(args, "seconds", 0.0))))
    return 0


async def _act(config: GatewayConfig, action: str, name: str, seconds: float) -> str:
    async with shared_store(config, f"source {action}") as store:
        if action == "pause":
            await store.pause_source(name, seconds)
            done = f"paused {name} fleet-wide"
        elif action == "resume":
            await store.resume_source(name)
            done = f"resumed {name} fleet-wide"
        else:
            await store.reset_source(name)
            done = f"reset {name} fleet-wide"
        return f"{done}; now: {describe(await store.snapshot(source_terms(config, name)))}"


def describe(state: SourceSnapshot) -> str:
    paused = f"paused {duration(state.paused_for_s)}" if state.paused_for_s > 0 else "not paused"
    failures = f" ({state.breaker_failures} failures)" if state.breaker_failures else ""
    return (
        f"breaker {state.breaker}{failures}, limit {state.permit_limit}, "
        f"{state.permits_in_use} in use, {paused}"
    )
