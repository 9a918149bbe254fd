"""Source layer: how a connection to a provider failed, in words no HTTP library decides.

The adapters' libraries (httpx, and httpx2 under the openai SDK) raise their
own exceptions; each adapter reads them into a `Failure`, and the core words
the reason by how far the attempt had got (see `exchange`).
"""

from __future__ import annotations

import enum
from typing import Any


class Failure(enum.Enum):
    """How a connection failed, in words that do not depend on the HTTP library."""

    POOL = "no free connection in this process's pool"
    TIMEOUT = "timeout"
    REFUSED = "connection refused"
    CONNECT = "could not connect"
    CLOSED = "connection closed"
    OTHER = "connection failed"


def library_failure(exc: BaseException, library: Any) -> Failure | None:
    """Read an exception of `library`, httpx or httpx2 (which share one exception tree)."""
    if isinstance(exc, library.PoolTimeout):
        return Failure.POOL
    if isinstance(exc, library.TimeoutException):
        return Failure.TIMEOUT
    if isinstance(exc, library.ConnectError):
        return Failure.REFUSED if _refused(exc) else Failure.CONNECT
    if isinstance(exc, (library.NetworkError, library.RemoteProtocolError)):
        return Failure.CLOSED
    if isinstance(exc, library.TransportError):
        return Failure.OTHER
    return None


def _refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(16):  # the chain: library error, connection pool error, OSError, ...
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
