"""Fault injection for the feature x fault matrix, and the checks that nothing is left.

- `MatrixWorker`: a real ``celery -A tests.celery.matrix_app worker`` process with a
  tag, stopped warm (SIGTERM), cold (SIGQUIT, Celery's cold shutdown) or killed;
- `kill_pids`: SIGKILL of pool children (a prefork child lost mid-run);
- `drop_broker_connections`: ``CLIENT KILL`` of every client of the broker databases
  (all but the killing connection itself): the workers lose their broker, result
  backend and publisher connections, never the governance store's (another database);
- `restart_redis`: SIGKILL of a persistent private server, then a start on the same
  port and data (AOF, ``appendfsync always``);
- `leftovers`: what is still queued, unacknowledged or parked, by task id.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import redis

from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"


def db_url(server: RedisServer, db: int) -> str:
    return f"redis://127.0.0.1:{server.port}/{db}"


class MatrixWorker:
    """One worker process of the matrix app; `start()` again after a stop makes a fresh one."""

    def __init__(
        self,
        tag: str,
        env: Mapping[str, str],
        log_dir: Path,
        *,
        pool: str = "prefork",
        concurrency: int = 4,
        queue: str = "matrix",
    ) -> None:
        self.tag = tag
        self.env = dict(env)
        self.log_dir = log_dir
        self.pool = pool
        self.concurrency = concurrency
        self.queue = queue
        self.generation = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def current_tag(self) -> str:
        return f"{self.tag}#{self.generation}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.current_tag.replace('#', '-')}.log"

    def start(self) -> None:
        self.generation += 1
        env = {**os.environ, **self.env, "MATRIX_WORKER_TAG": self.current_tag}
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.celery.matrix_app",
            "worker",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "-Q",
            self.queue,
            "-n",
            f"{self.tag}-{self.generation}@%h",
            "--loglevel",
            "WARNING",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ]
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def cold_shutdown(self, within_s: float = 30) -> None:
        """Celery's cold shutdown: SIGQUIT to the main process, which starts a soft
        shutdown, and SIGQUIT again, which cancels the running tasks (``SystemExit`` in
        the pool children) at once; then wait for the worker to end."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGQUIT)
        time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGQUIT)
        self._reap(within_s)

    def stop(self, within_s: float = 30) -> None:
        """Warm shutdown (SIGTERM to the process group), then SIGKILL if it lingers."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
        self._reap(within_s)

    def _reap(self, within_s: float) -> None:
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(within_s)
        # Whatever is left of its group (a pool child that outlived its parent) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def kill_pids(pids: Iterable[int]) -> list[int]:
    """SIGKILL each pid that still exists; returns those killed."""
    killed = []
    for pid in set(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def drop_broker_connections(server: RedisServer, dbs: Iterable[int]) -> int:
    """``CLIENT KILL`` every connection whose selected database is one of `dbs`."""
    wanted = set(dbs)
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    try:
        own = client.client_id()
        victims = [
            int(c["id"])
            for c in client.client_list()
            if int(c.get("db", -1)) in wanted and int(c["id"]) != own
        ]
        for victim in victims:
            with contextlib.suppress(redis.ResponseError):  # gone meanwhile
                client.client_kill_filter(_id=victim)
        return len(victims)
    finally:
        client.close()


def restart_redis(server: RedisServer, down_s: float = 1.0) -> None:
    """Restart the server (SIGTERM: it closes its AOF) on the same port and data.

    A crash (SIGKILL) is the soak tier's `test_redis_faults`: kombu's Redis transport
    pops a message (BRPOP) before it records it as unacknowledged, so a message whose
    pop reply is lost in the crash is gone, whatever the task does.
    """
    server.stop()
    time.sleep(down_s)  # down for a while: clients see refused connections, not a blip
    server.start()


@dataclass
class Leftovers:
    """What is still queued, unacknowledged or parked: counts, and the task ids found."""

    counts: dict[str, int] = field(default_factory=dict)
    task_ids: dict[str, set[str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not any(self.counts.values())

    def nonzero(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if v}

    def add(self, where: str, count: int, ids: Iterable[str] = ()) -> None:
        self.counts[where] = self.counts.get(where, 0) + count
        self.task_ids.setdefault(where, set()).update(ids)


def _message_task_id(raw: bytes | str) -> str | None:
    """The task id of a kombu Redis message (a queue item, or an unacked record)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if isinstance(data, list) and data:  # unacked: [message, exchange, routing key]
        data = data[0]
    if not isinstance(data, dict):
        return None
    headers = data.get("headers") or {}
    found = headers.get("id") or (data.get("properties") or {}).get("correlation_id")
    return str(found) if found else None


def leftovers(
    server: RedisServer,
    broker_dbs: Iterable[int],
    queue: str,
    store_db: int,
    prefixes: Iterable[str],
) -> Leftovers:
    """Queued (LLEN of the queue's lists), unacknowledged (kombu's ``unacked`` hash and
    ``unacked_index`` zset) and parked (every ``{prefix}:v1:parked:*`` sorted set)."""
    found = Leftovers()
    for db in broker_dbs:
        client = redis.Redis(host="127.0.0.1", port=server.port, db=db, socket_timeout=5)
        try:
            for key in client.scan_iter(match=f"{queue}*"):
                if client.type(key) == b"list":
                    items = client.lrange(key, 0, -1)
                    ids = (_message_task_id(i) for i in items)
                    found.add(f"queue@db{db}", len(items), (i for i in ids if i))
            unacked = client.hgetall(UNACKED)
            ids = (_message_task_id(v) for v in unacked.values())
            found.add(f"unacked@db{db}", len(unacked), (i for i in ids if i))
            found.add(f"unacked_index@db{db}", int(client.zcard(UNACKED_INDEX)))
        finally:
            client.close()
    client = redis.Redis(host="127.0.0.1", port=server.port, db=store_db, socket_timeout=5)
    try:
        for prefix in prefixes:
            for key in client.scan_iter(match=f"{{{prefix}}}:v1:parked:*"):
                if client.type(key) == b"zset":
                    members = [m.decode() for m in client.zrange(key, 0, -1)]
                    found.add("parked", len(members), members)
    finally:
        client.close()
    return found
