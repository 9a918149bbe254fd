"""Governance layer: waiting for something, on the injected clock, for at most so long."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from polygate_celery.clock import Clock

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
