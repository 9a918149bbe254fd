"""Store layer (Redis): the one place a failure of Redis becomes a `GovernanceBackendError`.

Every command and script sent to Redis (the governance store, and the Celery
edge's parking lot and run markers) runs inside `translated`, and every reply
is read inside `reading`; what they raise is one of:

- `StoreUnreachable`: no connection (refused, reset, a socket error), a
  timeout, a server still loading, no master (Sentinel) or no slot (a cluster
  down, a slot uncovered, ``TRYAGAIN``), a replica that no longer takes writes
  after a failover;
- `StoreReplyError`: an error the server answered (a script's own error,
  ``WRONGTYPE``, out of memory; ``NOSCRIPT`` is handled before it gets here)
  or a reply the store layer cannot read;
- `GovernanceBackendError` itself for anything else (credentials refused, or
  redis-py's ``RuntimeError`` for a connection made on another event loop).

Cancellation passes through. Messages name the operation and Redis's own
message, which carries an address, never a password; the cause is chained.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    ReadOnlyError,
    RedisClusterUnreachableError,
    RedisError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

from polygate_celery.errors import GovernanceBackendError, StoreReplyError, StoreUnreachable

_REFUSED = (AuthenticationError, AuthorizationError)  # ConnectionErrors waiting will not mend
_UNREACHABLE = (
    ConnectionError,  # also BusyLoadingError, Sentinel's MasterNotFoundError, a full pool
    TimeoutError,
    OSError,  # a socket's own error, and the builtin TimeoutError asyncio raises
    ClusterDownError,  # also MasterDownError
    TryAgainError,
    ReadOnlyError,  # a former master, now a replica: the next connection finds the new one
    RedisClusterUnreachableError,
    SlotNotCoveredError,
)
_REPLY = (RedisError, ValueError, TypeError, IndexError, KeyError)

CLUSTER_HINT = (
    " (the server is a Redis Cluster node: set store.cluster_nodes instead of store.redis_url)"
)


def error_class(exc: BaseException) -> type[GovernanceBackendError]:
    """Which `GovernanceBackendError` a failure of Redis (or of reading its reply) is."""
    if isinstance(exc, GovernanceBackendError):
        return type(exc)
    if isinstance(exc, _REFUSED):
        return GovernanceBackendError
    if isinstance(exc, _UNREACHABLE):
        return StoreUnreachable
    if isinstance(exc, _REPLY):
        return StoreReplyError
    return GovernanceBackendError


def backend_error(exc: Exception, op: str = "", hint: str = "") -> GovernanceBackendError:
    """`exc` as the `GovernanceBackendError` it is (unchanged if it is one already), its
    message prefixed with `op`; the caller chains the cause (``raise ... from exc``)."""
    if isinstance(exc, GovernanceBackendError):
        return exc
    prefix = f"{op}: " if op else ""
    return error_class(exc)(f"{prefix}{type(exc).__name__}: {exc}{hint}")


def bad_reply(op: str, reply: Any) -> StoreReplyError:
    """A reply of `op`'s that does not have the shape its script promises."""
    return StoreReplyError(f"{op}: unexpected reply {reply!r}")


def cluster_refusal(exc: BaseException, client: object) -> bool:
    """A server that answers as a cluster node, reached with a single-server client."""
    if isinstance(client, RedisCluster):
        return False
    return isinstance(exc, MovedError | AskError) or "not allowed in cluster mode" in str(exc)


class _Around:
    """A block whose failure `_failed` turns into a `GovernanceBackendError`."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        raise NotImplementedError


class translated(_Around):  # lower case: read as ``with translated("admit"):``
    """Around a command or script: any failure but cancellation leaves as the
    `GovernanceBackendError` it is (`error_class`), named `op`, its cause chained.

    Holds no state of a call's, so one made once per operation serves every call.
    With `client`, a single-server client that reached a cluster node says so.
    """

    __slots__ = ("client", "op")

    def __init__(self, op: str = "", client: object = None) -> None:
        self.op = op
        self.client = client

    def _failed(self, exc: BaseException) -> None:
        if not isinstance(exc, Exception) or isinstance(exc, GovernanceBackendError):
            return  # cancellation, or translated already: unchanged
        refusal = self.client is not None and cluster_refusal(exc, self.client)
        raise backend_error(exc, self.op, CLUSTER_HINT if refusal else "") from exc


class reading(_Around):  # lower case: read as ``with reading("admit", reply):``
    """Around the decoding of `reply`: an item missing, of the wrong type or unparsable
    is a `StoreReplyError` naming `op` and the reply, its cause chained."""

    __slots__ = ("op", "reply")

    def __init__(self, op: str, reply: Any) -> None:
        self.op = op
        self.reply = reply

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, ValueError | TypeError | IndexError | KeyError):
            raise bad_reply(self.op, self.reply) from exc
