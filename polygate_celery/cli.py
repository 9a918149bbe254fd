"""Edge: the `polygate-celery` command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from polygate_celery import __version__
from polygate_celery.demo import run_demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="polygate-celery", description="Governed AI model calls from Celery workers."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run governed calls on a simulated workload")
    demo.add_argument(
        "--seconds", type=int, default=300, help="simulated seconds of arrivals (default 300)"
    )
    args = parser.parse_args(argv)

    if args.command == "demo":
        if args.seconds < 1:
            parser.error("--seconds must be at least 1")
        return 1 if asyncio.run(run_demo(sys.stdout, args.seconds)) else 0
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
