"""Time as an injected dependency: the `Clock` protocol and the system clock.

Everything that reads time or sleeps does so through a `Clock`, so tests run in
virtual time (`polygate_celery.testing.VirtualClock`) and never sleep for real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar, runtime_checkable


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


T = TypeVar("T")


async def within(clock: Clock, seconds: float, awaitable: Awaitable[T]) -> tuple[bool, T | None]:
    """Await `awaitable` for at most `seconds` of `clock` time.

    Returns ``(True, result)`` when it finished first (its exception, if any, is
    raised), else ``(False, None)`` and it is cancelled. Cancellation of the
    caller cancels both and passes through.
    """
    task = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return True, task.result()
    if timer.done() and not timer.cancelled() and timer.exception() is not None:
        raise timer.exception()  # type: ignore[misc]
    return False, None
