"""A private Redis server for tests: the package's embedded server, plus fault controls.

Used when nothing answers on 127.0.0.1:6379, and by the fault tests, which need
a server of their own to pause, crash and restart.
"""

from __future__ import annotations

import gc
import os
import signal
import warnings

from polygate_celery import embedded


def reachable_redis(url: str = "redis://127.0.0.1:6379/0") -> str | None:
    return url if embedded.answers(url) else None


def server_binary() -> str:
    return embedded.server_binary()


def free_port() -> int:
    return embedded.free_port()


class RedisServer(embedded.EmbeddedRedis):
    """One private server process; with `persistent`, `appendfsync always`."""

    def kill(self) -> None:
        """Crash the server (SIGKILL); `start()` brings it back on the same port and data."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)
        self.process = None

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()  # a paused server cannot act on SIGTERM
            # Celery's result backend unsubscribes when an `AsyncResult` is collected: let
            # that happen now, while this server answers, not in some later test. What this
            # collects also closes the connections Celery's pools left open to this server
            # over the session: their ResourceWarnings are no test's doing (the last test
            # of the session would be blamed for them).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                gc.collect()
        super().stop()
