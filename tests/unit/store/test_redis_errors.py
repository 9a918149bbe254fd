"""Redis's failures, translated in one place: each kind of redis-py error to its subclass."""

from __future__ import annotations

import asyncio
import builtins

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    DataError,
    InvalidResponse,
    MasterDownError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterUnreachableError,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)
from redis.sentinel import MasterNotFoundError, SlaveNotFoundError

from polygate_celery.errors import GovernanceBackendError, StoreReplyError, StoreUnreachable
from polygate_celery.store.redis.errors import (
    CLUSTER_HINT,
    backend_error,
    error_class,
    reading,
    translated,
)

UNREACHABLE: list[BaseException] = [
    ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    TimeoutError("Timeout reading from socket"),
    BusyLoadingError("Redis is loading the dataset in memory"),
    MaxConnectionsError("Too many connections"),
    MasterNotFoundError("No master found for 'mymaster'"),
    SlaveNotFoundError("No replica found for 'mymaster'"),
    ClusterDownError("CLUSTERDOWN The cluster is down"),
    MasterDownError("MASTERDOWN Link with MASTER is down"),
    TryAgainError("TRYAGAIN"),
    ReadOnlyError("You can't write against a read only replica."),
    RedisClusterUnreachableError("no node of the cluster answered"),
    SlotNotCoveredError("slot 12 not covered"),
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
    builtins.TimeoutError("timed out"),  # a socket's, and asyncio's
    OSError(113, "No route to host"),
]
BAD_REPLY: list[BaseException] = [
    ResponseError("Error running script (call to f_1234): @user_script:12: boom"),
    ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    NoScriptError("NOSCRIPT No matching script"),  # when loading it again failed too
    OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'"),
    MovedError("3999 127.0.0.1:6381"),
    AskError("3999 127.0.0.1:6381"),
    InvalidResponse("Protocol Error: b'?'"),
    DataError("Invalid input of type: 'NoneType'"),
    ValueError("could not convert string to float: b'x'"),
    TypeError("'NoneType' object is not subscriptable"),
    IndexError("list index out of range"),
    KeyError("field"),
]
NEITHER: list[BaseException] = [
    AuthenticationError("invalid username-password pair or user is disabled."),
    AuthorizationError("NOPERM this user has no permissions"),
    RuntimeError("Task got Future attached to a different loop"),
]


def _name(exc: BaseException) -> str:
    return type(exc).__name__


@pytest.mark.parametrize("exc", UNREACHABLE, ids=_name)
def test_no_connection_or_no_answer_in_time_is_unreachable(exc: BaseException) -> None:
    assert error_class(exc) is StoreUnreachable


@pytest.mark.parametrize("exc", BAD_REPLY, ids=_name)
def test_an_answer_the_store_cannot_use_is_a_reply_error(exc: BaseException) -> None:
    assert error_class(exc) is StoreReplyError


@pytest.mark.parametrize("exc", NEITHER, ids=_name)
def test_refused_credentials_and_anything_else_stay_the_base(exc: BaseException) -> None:
    """Waiting would not mend refused credentials: not `StoreUnreachable`."""
    assert error_class(exc) is GovernanceBackendError


@pytest.mark.parametrize("exc", UNREACHABLE + BAD_REPLY + NEITHER, ids=_name)
def test_translated_names_the_operation_and_chains_the_cause(exc: Exception) -> None:
    with pytest.raises(GovernanceBackendError) as caught, translated("admit"):
        raise exc
    assert type(caught.value) is error_class(exc)
    assert caught.value.message == f"admit: {type(exc).__name__}: {exc}"
    assert caught.value.__cause__ is exc
    assert caught.value.scope is None


def test_without_an_operation_the_message_is_redis_own() -> None:
    with pytest.raises(StoreUnreachable) as caught, translated():
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    assert str(caught.value) == (
        "governance store unavailable: ConnectionError: "
        "Error 111 connecting to 127.0.0.1:6379. Connection refused."
    )


@pytest.mark.parametrize(
    "exc",
    [StoreUnreachable("x"), StoreReplyError("y"), GovernanceBackendError("z", "s")],
    ids=_name,
)
def test_an_error_translated_already_passes_unchanged(exc: GovernanceBackendError) -> None:
    with pytest.raises(GovernanceBackendError) as caught, translated("admit"):
        raise exc
    assert caught.value is exc


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), KeyboardInterrupt()], ids=_name)
def test_cancellation_passes_through(exc: BaseException) -> None:
    with pytest.raises(type(exc)), translated("admit"):
        raise exc


def test_nothing_raised_is_nothing_translated() -> None:
    with translated("admit"):
        answer = 1
    assert answer == 1


async def test_one_instance_serves_calls_in_turn_and_at_once() -> None:
    admit = translated("admit")

    async def fails(exc: Exception) -> None:
        with admit:
            await asyncio.sleep(0)
            raise exc

    results = await asyncio.gather(
        fails(TimeoutError("t")), fails(ResponseError("r")), return_exceptions=True
    )
    assert [type(r) for r in results] == [StoreUnreachable, StoreReplyError]


async def test_a_cluster_node_reached_with_a_server_client_says_so() -> None:
    client = Redis()
    with pytest.raises(StoreReplyError) as caught, translated("admit", client):
        raise MovedError("3999 127.0.0.1:6381")
    assert caught.value.message.endswith(CLUSTER_HINT)
    with pytest.raises(StoreReplyError) as caught, translated("admit", client):
        raise ResponseError("SELECT is not allowed in cluster mode")
    assert caught.value.message.endswith(CLUSTER_HINT)
    with pytest.raises(StoreUnreachable) as caught, translated("admit", client):
        raise TimeoutError("t")
    assert CLUSTER_HINT not in caught.value.message
    await client.aclose()


def test_a_cluster_client_gets_no_hint() -> None:
    client = RedisCluster.__new__(RedisCluster)  # never connected
    with pytest.raises(StoreReplyError) as caught, translated("admit", client):
        raise MovedError("3999 127.0.0.1:6381")
    assert CLUSTER_HINT not in caught.value.message


def test_a_reply_that_cannot_be_read_names_the_operation_and_the_reply() -> None:
    reply = [b"1", b"x"]
    with pytest.raises(StoreReplyError) as caught, reading("gate", reply):
        float(reply[1])
    assert caught.value.message == "gate: unexpected reply [b'1', b'x']"
    assert isinstance(caught.value.__cause__, ValueError)


def test_reading_lets_a_translated_error_and_a_success_through() -> None:
    with reading("gate", b"1"):
        value = float(b"1")
    assert value == 1.0
    with pytest.raises(StoreUnreachable), reading("gate", b"1"):
        raise StoreUnreachable("x")


def test_backend_error_keeps_a_translated_error() -> None:
    exc = StoreReplyError("r", "s")
    assert backend_error(exc, "admit") is exc
    assert type(backend_error(TryAgainError("TRYAGAIN"), "renew")) is StoreUnreachable
