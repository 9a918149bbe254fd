"""Edge (CLI): a user's mistake ends as one ``error:`` line and exit status 2, no traceback.

Commands raise `CliError` with a message written for the operator (a field
path, a host:port, a name); `ArgumentParser` reports bad arguments the same
way. Messages never hold a secret: they are built from redacted parts.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, TypeAlias

USAGE_ERROR = 2


class CliError(Exception):
    """A mistake in what the user asked for or configured, told in one line."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with its errors on one ``error:`` line (the usage is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"error: {message} (see: {self.prog} --help)\n")


Commands: TypeAlias = "argparse._SubParsersAction[ArgumentParser]"
"""Where each command module adds its parser (`add_command`)."""


def report(error: CliError) -> int:
    """Print `error` as the one line it is; the exit status of a user mistake."""
    text = " ".join(str(error).split())  # one line, whatever the message held
    print(f"error: {text}", file=sys.stderr)
    return USAGE_ERROR


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value
