"""Real Redis topologies for tests, started from the redis-server binary on free ports.

`SentinelGroup`: a master, one replica and three sentinels (quorum 2) that
notice a dead master within a second and promote the replica.
`RedisClusterGroup`: three masters and three replicas made into a Redis Cluster
by ``redis-cli --cluster create``. Both live in a temporary directory, removed
with every process on exit. Nothing is mocked: a test kills a master process
and waits for the real failover.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from tests.redis_server import server_binary

SERVICE = "governance"
"""The prefix of a `SentinelGroup`'s service name (each group's own: `SentinelGroup.service`),
so that sentinels of groups run side by side never count each other, even on a port
one group freed and another took."""
DEADLINE_S = 60.0
DOWN_AFTER_MS = 3000
"""How long a silent master takes to be called down (Sentinel's down-after-milliseconds,
a Cluster's node timeout): the failover tests' window in which no master answers. Long
enough that a busy machine's callers start calls in it."""


def wait_for(
    condition: Callable[[], bool], what: str | Callable[[], str], within_s: float = DEADLINE_S
) -> None:
    """Wait until `condition`; else a `TimeoutError` saying `what` (or what it returns then)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if condition():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise TimeoutError(f"{said}: not within {within_s:g} s")
        time.sleep(0.05)


class _Processes:
    def __init__(self, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, port: int, *args: str) -> None:
        here = self.dir / str(port)
        here.mkdir(exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [server_binary(), *args, "--logfile", str(here / "log")],
            cwd=here,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self, port: int) -> None:
        """SIGKILL the process on `port` (a crash: no shutdown, nothing saved)."""
        process = self.processes.pop(port)
        process.kill()
        process.wait(10)

    def log(self, port: int) -> str:
        """The server log of the process on `port` (for a failing test's message)."""
        path = self.dir / str(port) / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def _server_args(port: int) -> list[str]:
    return [
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--maxmemory-policy", "noeviction",
        "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not 5 s later
    ]  # fmt: skip


def _free_ports(n: int) -> list[int]:
    """`n` distinct free ports of 127.0.0.1 (each held until all are chosen)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)


class SentinelGroup(_Processes):
    """A master, a replica and three sentinels on 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__("polygate-sentinel-")
        self.service = f"{SERVICE}-{uuid.uuid4().hex[:8]}"
        self.master_port, self.replica_port, *self.sentinel_ports = _free_ports(5)

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.sentinel_ports]

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        self.spawn(self.master_port, *_server_args(self.master_port))
        self.spawn(
            self.replica_port,
            *_server_args(self.replica_port),
            "--replicaof", "127.0.0.1", str(self.master_port),
        )  # fmt: skip
        wait_for(lambda: _replicating(self.replica_port), "the replica to sync")
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.master_port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {self.service} 5000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
            self.spawn(port, str(conf), "--sentinel")
        for port in self.sentinel_ports:
            wait_for(lambda port=port: self._sees_everyone(port), self._meeting)

    def _meeting(self) -> str:
        """What each sentinel sees, for a group whose sentinels did not meet."""
        seen = []
        for port in self.sentinel_ports:
            try:
                with _client(port) as client:
                    master = client.sentinel_master(self.service)
                seen.append(f"{port}: {master.get('num-other-sentinels')} other sentinels")
            except (redis.RedisError, OSError) as exc:
                seen.append(f"{port}: {exc!r}; log: {self.log(port)[-500:]}")
        return "the sentinels to meet (" + "; ".join(seen) + ")"

    def _sees_everyone(self, port: int) -> bool:
        with _client(port) as client:
            master = client.sentinel_master(self.service)
            replicas = client.sentinel_slaves(self.service)
        return int(master["num-other-sentinels"]) == len(self.sentinel_ports) - 1 and any(
            r["port"] == self.replica_port and not r["is_sdown"] for r in replicas
        )

    def named(self) -> set[int]:
        """The ports the sentinels name as the master (one when they agree)."""
        ports = set()
        for port in self.sentinel_ports:
            with _client(port) as client:
                ports.add(int(client.sentinel_get_master_addr_by_name(self.service)[1]))
        return ports

    def master(self) -> int:
        """The port of the master every sentinel names."""
        ports = self.named()
        if len(ports) != 1:
            raise RuntimeError(f"the sentinels disagree on the master: {sorted(ports)}")
        return ports.pop()

    def kill_master(self) -> int:
        """SIGKILL the master; returns the port that was killed."""
        port = self.master()
        self.kill(port)
        return port

    def wait_for_promotion(self, old: int, within_s: float = DEADLINE_S) -> int:
        """Wait until every sentinel names a new, answering master; its port."""

        def promoted() -> bool:
            ports = self.named()
            if len(ports) != 1 or old in ports:
                return False
            with _client(ports.pop()) as client:
                return client.info("replication")["role"] == "master"

        wait_for(promoted, "the replica to be promoted", within_s)
        return self.master()


def _cluster_port() -> int:
    """A free port whose cluster bus port (10000 above) is free too, both below 65536."""
    rng = random.SystemRandom()
    while True:
        port = rng.randrange(20000, 40000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port


def _replicating(port: int) -> bool:
    with _client(port) as client:
        return client.info("replication").get("master_link_status") == "up"


class RedisClusterGroup(_Processes):
    """Three masters and three replicas, one Redis Cluster, on 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__("polygate-cluster-")
        self.ports: list[int] = []
        while len(self.ports) < 6:
            port = _cluster_port()
            if port not in self.ports and port + 10000 not in self.ports:
                self.ports.append(port)

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _spawn_node(self, port: int) -> None:
        self.spawn(
            port,
            *_server_args(port),
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", str(DOWN_AFTER_MS),
        )  # fmt: skip

    def _node_answers(self, index: int) -> bool:
        """Whether node `index` answers; a node that exited (its port or bus port taken
        between the check and its start, by another test's server or connection) is
        started again on other ports."""
        port = self.ports[index]
        if self.processes[port].poll() is not None:
            del self.processes[port]
            while (fresh := _cluster_port()) in self.ports or fresh + 10000 in self.ports:
                pass
            self.ports[index] = fresh
            self._spawn_node(fresh)
            return False
        return bool(_client(port).ping())

    def start(self) -> None:
        for port in self.ports:
            self._spawn_node(port)
        for index in range(len(self.ports)):
            wait_for(lambda index=index: self._node_answers(index), "the nodes to start")
        cli = shutil.which("redis-cli") or str(Path(server_binary()).with_name("redis-cli"))
        subprocess.run(
            [cli, "--cluster", "create", *self.nodes, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=DEADLINE_S,
        )
        wait_for(self._settled, "the cluster to be ok on every node")

    def _settled(self) -> bool:
        """Every node says ok, every slot is served by a master, and every replica is in
        sync (a replica that never synced cannot take over)."""
        for port in self.processes:
            with _client(port) as client:
                if client.cluster("info").get("cluster_state") != "ok":
                    return False
                replication = client.info("replication")
                if replication["role"] != "master" and not _replicating(port):
                    return False
        return len(self.masters()) == 3

    def masters(self) -> dict[int, list[tuple[int, int]]]:
        """Master port -> its slot ranges, as a live node sees them."""
        port = next(iter(self.processes))
        with _client(port) as client:
            slots = client.cluster("slots")
        found: dict[int, list[tuple[int, int]]] = {}
        for start, end, master, *_ in slots:
            found.setdefault(int(master[1]), []).append((int(start), int(end)))
        return found

    def owner(self, slot: int) -> int:
        for port, ranges in self.masters().items():
            if any(start <= slot <= end for start, end in ranges):
                return port
        raise LookupError(slot)

    def kill_master_of(self, slot: int) -> int:
        """SIGKILL the master serving `slot`; returns its port."""
        port = self.owner(slot)
        self.kill(port)
        return port

    def wait_for_promotion(self, old: int, slot: int, within_s: float = DEADLINE_S) -> int:
        """Wait until a live master serves `slot` again and the cluster is ok; its port."""

        def promoted() -> bool:
            port = self.owner(slot)
            if port == old or port not in self.processes:
                return False
            for live in self.processes:
                with _client(live) as client:
                    if client.cluster("info").get("cluster_state") != "ok":
                        return False
            return True

        wait_for(promoted, "a replica to take the slot over", within_s)
        return self.owner(slot)
