"""Time as an injected dependency: the `Clock` protocol and the system clock.

Everything that reads time or sleeps does so through a `Clock`, so tests run in
virtual time (`polygate_celery.testing.VirtualClock`) and never sleep for real.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The local monotonic clock and the event loop's sleep."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


@runtime_checkable
class WaitsForIO(Protocol):
    """A virtual clock that must not move while real I/O it is told about is in flight.

    A store that does network I/O under an injected clock wraps each round trip
    in `waiting_for_io()`, so virtual time stands still until the reply is in.
    """

    def waiting_for_io(self) -> AbstractContextManager[None]: ...
