"""Edge: the `polygate-celery` command line, one module per command.

``demo`` runs the demonstration; ``status``, ``check-config``, ``source`` and
``metrics`` are the operator's commands. A user's mistake (a bad argument, an
invalid configuration, an unreachable Redis, an unknown name, a command whose
extra is not installed) ends as one ``error:`` line on stderr and exit status
2, never a traceback; nothing printed holds a secret.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from polygate_celery import __version__
from polygate_celery.cli import check_config, demo, example, metrics, source, status
from polygate_celery.cli.errors import ArgumentParser, CliError, missing_extra, report

INTERRUPTED = 130
BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a reader that left


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))


def build_parser() -> ArgumentParser:
    """The command line's parser, every command's under it (the manual's reference is
    generated from it)."""
    parser = ArgumentParser(
        prog="polygate-celery", description="Governed AI model calls from Celery workers."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (demo, status, check_config, source, metrics, example):
        command.add_command(commands)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run a command: its mistakes are one line each, Ctrl-C is quiet."""
    try:
        code: int = args.run(args)
    except CliError as error:
        return report(error)
    except ImportError as exc:  # a module of an extra that is not installed
        program = getattr(args, "program", None) or f"polygate-celery {args.command}"
        missing = missing_extra(exc, program, getattr(args, "extra", None))
        if missing is None:
            raise
        return report(missing)
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
