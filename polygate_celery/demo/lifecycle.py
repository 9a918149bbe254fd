"""Edge (demo): what `polygate-celery demo` starts, how it stops it, and how to look at it.

The demo starts a Redis server, a Celery worker and a simulated provider. Ctrl-C,
SIGTERM and SIGHUP (what ``timeout``, CI runners, process managers and a closed
terminal send) all unwind the same way: every process the demo started is stopped
before it exits. The worker runs in its own session, so a signal sent to the demo's
process group does not reach it half-way; the demo stops it itself, at once
(Celery's cold shutdown, then SIGKILL), since what it was doing no longer matters.

The run's configuration is written to a file in the run's directory, so that
``polygate-celery status --config FILE`` reads the same Redis, key prefix and
settings as the worker (`status_command`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
WORKER_GRACE_S = 15.0  # a finished run: the idle worker's warm shutdown
ABORT_GRACE_S = 5.0  # an interrupted run: Celery's cold shutdown, then SIGKILL


class Stopped(BaseException):
    """The demo was sent SIGTERM or SIGHUP; raised where it was, to unwind like Ctrl-C.

    A `BaseException`, as `KeyboardInterrupt` is, so no ``except Exception`` on the
    way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum


class Received:
    """The stopping signal `stopped_by_signals` has received, if any. Its handler raises
    where the demo is, but Python drops an exception raised inside a ``__del__`` or a
    callback it calls for a library; `check`, called where the demo polls, raises it
    again so that a lost raise cannot leave the demo running."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def check(self) -> None:
        """Raise what the signal received raised (`Stopped`, or `KeyboardInterrupt` for
        Ctrl-C); nothing if none was."""
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is not None:
            raise Stopped(self.signum)


@contextlib.contextmanager
def stopped_by_signals(signals: Sequence[int] = STOPPING_SIGNALS) -> Iterator[Received]:
    """Inside, the first of `signals` raises `Stopped` (Ctrl-C, `KeyboardInterrupt`, as
    ever); later ones, and a Ctrl-C after them, are ignored while the demo cleans up. The
    previous handlers come back on the way out.

    Python can set signal handlers in its main thread only: elsewhere this does nothing."""
    received = Received()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        if received.signum is None:
            received.signum = signum
            received.check()

    handled = list(signals)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when ignored
        handled.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, stop) for signum in handled}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def worker_process(
    command: Sequence[str], env: Mapping[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    """The worker, in its own session; stopped on the way out, at once if the run was cut short."""
    process = subprocess.Popen(
        list(command), env=dict(env), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    finished = False
    try:
        yield process
        finished = True
    finally:
        if finished:
            _stop(process, signal.SIGTERM, WORKER_GRACE_S)
        else:
            _stop(process, signal.SIGQUIT, ABORT_GRACE_S)


def _stop(process: subprocess.Popen[bytes], signum: int, grace_s: float) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_text(config: Mapping[str, Any]) -> str:
    """`config` (tables of strings, numbers, booleans and lists of them) as TOML.

    JSON's spelling of those values is valid TOML, so `json.dumps` writes each one."""
    lines: list[str] = []

    def key(name: str) -> str:
        return name if BARE_KEY.fullmatch(name) else json.dumps(name)

    def table(path: list[str], body: Mapping[str, Any]) -> None:
        values = {k: v for k, v in body.items() if not isinstance(v, Mapping)}
        if path and (values or not body):
            lines.extend(["", f"[{'.'.join(key(p) for p in path)}]"])
        lines.extend(f"{key(k)} = {json.dumps(v)}" for k, v in values.items())
        for name, sub in body.items():
            if isinstance(sub, Mapping):
                table([*path, name], sub)

    table([], config)
    return "\n".join(lines).lstrip("\n") + "\n"


def cli_command() -> str:
    """How to run `polygate-celery` as this process was run, for a command to copy."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == "polygate-celery":
        found = shutil.which("polygate-celery")
        if found and Path(found).resolve() == Path(argv0).resolve():
            return "polygate-celery"
        return shlex.quote(argv0)
    return f"{shlex.quote(sys.executable)} -m polygate_celery"


def status_command(config: Path) -> str:
    """The command that shows the run's governance state."""
    return f"{cli_command()} status --config {shlex.quote(str(config))}"
