"""Edge: the arguments of `polygate-celery demo`; the demo itself
(`polygate_celery.demo.cli`) is imported only when the command runs.

By default it runs the example pipeline end to end on a private setup: a Redis
(``--redis-url``, else ``$POLYGATE_REDIS_URL``, else an embedded server), a simulated
provider and a real Celery worker. ``--offline`` runs the governance loop alone on a
simulated workload in virtual time instead, with nothing started.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from polygate_celery.cli.errors import Commands, positive_int


def add_command(commands: Commands) -> None:
    parser = commands.add_parser(
        "demo",
        help="run the example pipeline on an embedded Redis, a simulated provider and a worker",
        description=(
            "Run the example pipeline (OCR, embed, summarise) end to end: a Redis "
            "(--redis-url, else $POLYGATE_REDIS_URL, else an embedded server), a simulated "
            "provider with a rate limit and an outage, and a Celery worker. Exit 0 when every "
            "task is accounted for."
        ),
    )
    parser.add_argument(
        "--documents", type=positive_int, default=40, help="documents to send (default 40)"
    )
    parser.add_argument(
        "--pages", type=positive_int, default=5, help="pages per document (default 5)"
    )
    parser.add_argument(
        "--redis-url", metavar="URL", help="use this Redis (default: $POLYGATE_REDIS_URL, else "
        "an embedded server)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=positive_int, default=300, metavar="SECONDS",
        help="give up after this long (default 300)",
    )  # fmt: skip
    parser.add_argument(
        "--plot", metavar="FILE", type=Path,
        help="draw the run's timeline (requests, 429s, 503s, deferrals per second) as a PNG "
        "(needs matplotlib)",
    )  # fmt: skip
    parser.add_argument(
        "--keep",
        action="store_true",
        help="after the run, leave its Redis and configuration up for `polygate-celery status`"
        " (the demo prints how to look and how to stop them)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="run the governance loop alone in virtual time: no Redis, no worker",
    )
    parser.add_argument(
        "--seconds", type=positive_int, default=300,
        help="with --offline: simulated seconds of arrivals (default 300)",
    )  # fmt: skip
    parser.set_defaults(run=run, extra="demo")  # whichever of its modules is missing


def run(args: argparse.Namespace) -> int:
    from polygate_celery.demo.cli import run as run_demo  # noqa: PLC0415 - the demo's edge

    return run_demo(args)
