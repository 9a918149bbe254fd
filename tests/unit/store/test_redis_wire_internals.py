"""What store/redis/wire.py relies on in redis-py beyond its public API, pinned.

admit and settle are sent packed once, on connections the store keeps, written
straight into the connection's stream writer (measured: the public `evalsha` or
`AsyncScript` costs some 130 microseconds more per governed call, about half a
round trip more). That path reads names redis-py does not promise to keep. Each
test here names one; a redis-py upgrade that changes it fails here, saying what
wire.py must be changed for, instead of the store slowing down or failing later.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import NoScriptError

from polygate_celery.store.redis.wire import Command, KeptConnections

UPGRADE = f"redis-py {redis.__version__} changed what store/redis/wire.py relies on: "


def test_the_pool_lends_and_takes_back_connections() -> None:
    for name in ("get_connection", "release"):
        method = getattr(ConnectionPool, name, None)
        assert inspect.iscoroutinefunction(method), (
            UPGRADE + f"ConnectionPool.{name} is no longer a coroutine method (KeptConnections)"
        )


def test_a_connection_offers_what_a_kept_roundtrip_calls() -> None:
    for name in ("connect", "can_read", "read_response", "send_packed_command", "disconnect"):
        method = getattr(AbstractConnection, name, None)
        assert inspect.iscoroutinefunction(method), (
            UPGRADE + f"AbstractConnection.{name} is no longer a coroutine method"
        )
    assert "nowait" in inspect.signature(AbstractConnection.disconnect).parameters, (
        UPGRADE + "AbstractConnection.disconnect no longer takes nowait (_send's failures)"
    )
    assert isinstance(inspect.getattr_static(AbstractConnection, "is_connected"), property), (
        UPGRADE + "AbstractConnection.is_connected is no longer a property"
    )


async def test_a_plain_client_has_the_pool_the_store_keeps_connections_of(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        assert client.single_connection_client is False, UPGRADE + "single_connection_client"
        assert isinstance(client.connection_pool, ConnectionPool), UPGRADE + "connection_pool"
        assert KeptConnections.of(client) is not None
    finally:
        await client.aclose()


async def test_a_connected_connection_writes_through_its_stream_writer(redis_url: str) -> None:
    """`_writer` (private) is an `asyncio.StreamWriter` once connected, with the socket
    timeout beside it: wire._send writes into it without redis-py's per-write task."""
    client = Redis.from_url(redis_url)
    pool = client.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await connection.connect()  # type: ignore[no-untyped-call]
        assert connection.is_connected
        writer = getattr(connection, "_writer", None)
        assert isinstance(writer, asyncio.StreamWriter), (
            UPGRADE + f"a connected connection's _writer is {type(writer).__name__}, not an "
            "asyncio.StreamWriter: wire._send falls back to send_packed_command (slower); "
            "write through what replaced it"
        )
        assert hasattr(connection, "socket_timeout"), UPGRADE + "socket_timeout"
        assert not await connection.can_read(), UPGRADE + "can_read on an idle connection"
        writer.write(b"*1\r\n$4\r\nPING\r\n")
        assert await connection.read_response() in (b"PONG", "PONG"), UPGRADE + "read_response"
        # A hand-packed EVALSHA of a script the server does not know: NOSCRIPT is raised
        # as NoScriptError by read_response, as _Scripts.send expects to load it then.
        command = Command([b"k"], [b"tail"])
        writer.write(command.pack(b"0" * 40, [b"arg"]))
        with pytest.raises(NoScriptError):
            await connection.read_response()
    finally:
        await pool.release(connection)
        await client.aclose()
