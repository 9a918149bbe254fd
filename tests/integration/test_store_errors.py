"""A real Redis gone, or answering what a script cannot use: the subclass says which."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from polygate_celery import StoreReplyError, StoreUnreachable
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store import AdmitRequest, Grant
from polygate_celery.store.redis import LuaScript, RedisStore, run_script, sync_redis_client
from tests.redis_server import RedisServer

TERMS = SourceTerms("a", 2)
PING = LuaScript("return redis.call('PING')")


async def test_a_stopped_server_is_unreachable_to_the_store_and_to_the_run_markers() -> None:
    with RedisServer() as server:
        store = RedisStore.from_url(server.url, socket_timeout_s=1.0)
        marker = sync_redis_client(server.url, socket_timeout_s=1.0)
        client = Redis.from_url(server.url, socket_timeout=1.0)
        try:
            assert isinstance(await store.admit(AdmitRequest("s", (TERMS,), "p")), Grant)
            assert PING.run_blocking(marker, [], []) in (b"PONG", "PONG")
            server.stop()
            with pytest.raises(StoreUnreachable) as caught:
                await store.admit(AdmitRequest("s", (TERMS,), "q"))
            assert caught.value.message.startswith("admit: ConnectionError: ")
            with pytest.raises(StoreUnreachable):
                await store.gate_closed_for_s("s")
            with pytest.raises(StoreUnreachable):  # the run markers' blocking path (guard)
                PING.run_blocking(marker, [], [])
            with pytest.raises(StoreUnreachable):  # the parking lot's and heartbeat's path
                await run_script(PING, client, [], [])
        finally:
            await store.aclose()
            marker.close()
            await client.aclose()


async def test_an_unreachable_store_never_quotes_the_password() -> None:
    with RedisServer() as server:
        port = server.port
    store = RedisStore.from_url(f"redis://:s3cret-pw@127.0.0.1:{port}/0")
    try:
        with pytest.raises(StoreUnreachable) as caught:
            await store.admit(AdmitRequest("s", (TERMS,), "p"))
        assert "s3cret-pw" not in str(caught.value)
        assert "s3cret-pw" not in repr(caught.value.args)
        assert "127.0.0.1" in str(caught.value)
    finally:
        await store.aclose()


async def test_a_key_of_the_wrong_type_is_a_reply_error(redis_url: str, fleet_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=fleet_prefix)
    try:
        await store.client.set(store.keys.permits("a"), "not a sorted set")
        with pytest.raises(StoreReplyError, match="WRONGTYPE") as caught:
            await store.admit(AdmitRequest("s", (TERMS,), "p"))
        assert caught.value.message.startswith("admit: ResponseError: ")
    finally:
        await store.aclose()


async def test_a_script_error_is_a_reply_error(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        with pytest.raises(StoreReplyError, match="boom"):
            await run_script(LuaScript("return redis.error_reply('boom')"), client, [], [])
    finally:
        await client.aclose()
