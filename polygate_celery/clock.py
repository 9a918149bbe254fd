"""Time as an injected dependency: the `Clock` protocol and the system clock.

Everything that reads time or sleeps does so through a `Clock`, so tests run in
virtual time (`polygate_celery.testing.VirtualClock`) and never sleep for real.
"""

from __future__ import annotations

import asyncio
import time
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
