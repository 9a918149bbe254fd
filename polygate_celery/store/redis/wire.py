"""Store layer (Redis): the hot scripts' commands, packed once, sent on kept connections.

redis-py packs every argument of every command in Python, then runs the command
through its retry, observability and pool machinery. For `admit` and `settle`,
each with some twenty arguments of which all but a few are the same for every
call of a source, that costs more than the loopback round trip itself. So the
fixed part of each command (the script's keys and the source's terms) is packed
once per source and scope (`Command`), the few arguments a call changes are
packed when it is sent, and the command goes out (written to the socket at once,
without the task redis-py starts per write) on a connection the store keeps
between calls (`KeptConnections`): taken from the client's pool, connected anew
before a use if the server has closed it since the last, given back to the pool
after any failure (redis-py has already closed it if the failure was the
connection's).

A client that is not a plain `redis.asyncio.Redis` on a connection pool (a
cluster client, say) gets the same arguments through its own ``evalsha``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

KEEP = 8  # connections kept between calls, per store (more calls at once use the pool)


def bulk(value: bytes) -> bytes:
    """`value` as one RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


class Command:
    """An ``EVALSHA`` of one script with fixed keys, after the per-call arguments fixed
    ones (`tail`): packed once, completed per call by `pack`."""

    __slots__ = ("_count", "_packed_keys", "_packed_tail", "keys", "tail")

    def __init__(self, keys: Sequence[bytes], tail: Sequence[bytes]) -> None:
        self.keys = tuple(keys)
        self.tail = tuple(tail)
        self._count = 3 + len(self.keys) + len(self.tail)
        self._packed_keys = bulk(b"%d" % len(self.keys)) + b"".join(map(bulk, self.keys))
        self._packed_tail = b"".join(map(bulk, self.tail))

    def pack(self, sha: bytes, args: Sequence[bytes]) -> bytes:
        """The whole command, `args` first among the script's arguments."""
        return b"".join(
            (
                b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n" % (self._count + len(args), len(sha), sha),
                self._packed_keys,
                *[bulk(arg) for arg in args],
                self._packed_tail,
            )
        )

    def arguments(self, args: Sequence[bytes]) -> list[bytes]:
        """The script's arguments, as `Redis.evalsha` takes them after the keys."""
        return [*args, *self.tail]


class KeptConnections:
    """Up to `KEEP` connections of a plain client's pool, kept between calls."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._idle: list[AbstractConnection] = []
        self._closed = False

    @classmethod
    def of(cls, client: object) -> KeptConnections | None:
        """Kept connections for `client`, or None for one this does not apply to."""
        if not isinstance(client, Redis) or client.single_connection_client:
            return None
        pool = client.connection_pool
        return cls(pool) if isinstance(pool, ConnectionPool) else None

    async def roundtrip(self, packed: bytes) -> Any:
        """Send one packed command and read its reply (a `ResponseError` is raised)."""
        pool = self._pool
        if self._idle:
            connection = self._idle.pop()
        else:
            connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            # Closed by the server since its last use (a restart, CLIENT KILL, a timeout):
            # connect anew rather than fail this call (redis-py 8's pool checks this only
            # with maintenance notifications off).
            if connection.is_connected and await _closed_or_dirty(connection):
                await connection.disconnect()
            await _send(connection, packed)
            reply = await connection.read_response()
        except BaseException:
            await pool.release(connection)
            raise
        if self._closed or len(self._idle) >= KEEP:
            await pool.release(connection)
        else:
            self._idle.append(connection)
        return reply

    async def aclose(self) -> None:
        """Give the kept connections back to the pool (before it closes)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await self._pool.release(connection)


async def _closed_or_dirty(connection: AbstractConnection) -> bool:
    """The idle connection has data pending, or the server closed it: redis-py before
    8.2 answers True for both; 8.2 raises ``ConnectionError`` for a closed one."""
    try:
        return bool(await connection.can_read())
    except (RedisConnectionError, OSError):
        return True


async def _send(connection: AbstractConnection, packed: bytes) -> None:
    """`connection.send_packed_command`, without the task it starts per write to time it
    out: the command goes into the socket's buffer at once, and only a buffer the server
    does not drain is waited for (under the socket timeout). On a connection without the
    stream writer this relies on, `send_packed_command` itself."""
    if not connection.is_connected:
        await connection.connect()  # type: ignore[no-untyped-call]
    writer = getattr(connection, "_writer", None)
    if not isinstance(writer, asyncio.StreamWriter):
        await connection.send_packed_command(packed)
        return
    try:
        writer.write(packed)
        if writer.transport.get_write_buffer_size() > 0:
            async with asyncio.timeout(connection.socket_timeout):
                await writer.drain()
    except TimeoutError:
        await connection.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        await connection.disconnect(nowait=True)
        raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
