"""Testing: a virtual clock that advances only when every task is waiting on it.

`VirtualClock.sleep()` parks the caller on a timer heap. Time never moves while
any task on the event loop can still run: a wake-up callback checks the loop's
ready queue and, only when it is empty (every task is blocked), jumps time to
the earliest timer and wakes every sleeper due then, in the order they went to
sleep. Concurrent calls therefore interleave deterministically, and a
five-minute timeout costs no real time.

The clock drives tasks that wait on it and on each other. Real I/O is waited
for only when it is wrapped in `waiting_for_io()` (the Redis store does this for
every round trip when given this clock); otherwise time may jump while a reply
is in flight. `advance()` moves time by hand.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager

# Loops without a readable ready queue (uvloop): hand the loop this many
# turns before judging it idle.
_FALLBACK_IDLE_TURNS = 50


class VirtualClock:
    """A `Clock` whose time is virtual. Pass the same instance to the gateway and the store.

    Time moves only when every task on the event loop waits: then it jumps to
    the earliest sleeper's wake-up. A five-minute stall costs no real time.

    Args:
        start: The time it starts at, in seconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._wakeup: asyncio.Handle | None = None
        self._wakeup_loop: asyncio.AbstractEventLoop | None = None
        self._io_in_flight = 0

    def now(self) -> float:
        """The virtual time, in seconds."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Wait until the virtual time has moved `seconds` on.

        Raises:
            ValueError: `seconds` is infinite (nothing would ever wake it).
        """
        if not seconds > 0:  # also catches NaN
            await asyncio.sleep(0)
            return
        if math.isinf(seconds):
            raise ValueError("cannot sleep forever on a virtual clock")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._timers, (self._now + seconds, next(self._order), future))
        self._schedule(loop)
        try:
            await future
        finally:
            if not future.done():
                future.cancel()  # a cancelled sleeper; its timer is skipped when reached

    @contextmanager
    def waiting_for_io(self) -> Iterator[None]:
        """Hold time still while the enclosed real I/O is in flight."""
        self._io_in_flight += 1
        try:
            yield
        finally:
            self._io_in_flight -= 1
            if self._io_in_flight == 0 and self._timers:
                self._schedule(asyncio.get_running_loop())

    def advance(self, seconds: float) -> None:
        """Move time forward by hand. Sleepers that come due wake on the next idle turn.

        Raises:
            ValueError: `seconds` is negative or NaN.
        """
        if not seconds >= 0:  # also rejects NaN
            raise ValueError("time only moves forward")
        self._now += seconds

    def _schedule(self, loop: asyncio.AbstractEventLoop, turns: int = 0) -> None:
        # A wake-up queued on another (or a closed) loop will never run: replace it.
        if self._wakeup is None or self._wakeup_loop is not loop:
            self._wakeup = loop.call_soon(self._on_idle, loop, turns)
            self._wakeup_loop = loop

    def _on_idle(self, loop: asyncio.AbstractEventLoop, turns: int) -> None:
        self._wakeup = None
        if self._io_in_flight:
            return  # rescheduled when the last I/O completes
        if _busy(loop, turns):
            self._schedule(loop, turns + 1)
            return
        while self._timers and self._timers[0][2].done():
            heapq.heappop(self._timers)
        if not self._timers:
            return
        self._now = max(self._now, self._timers[0][0])
        while self._timers and self._timers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._timers)
            if not future.done():
                future.set_result(None)
        if self._timers:
            self._schedule(loop)


def _busy(loop: asyncio.AbstractEventLoop, turns: int) -> bool:
    """Can anything on `loop` still run, other than virtual clocks waiting for idleness?

    Wake-ups of other virtual clocks on the same loop do not count, or two
    clocks would each see the other as work and never advance.
    """
    ready = getattr(loop, "_ready", None)
    if ready is None:
        return turns < _FALLBACK_IDLE_TURNS
    return any(
        getattr(getattr(h, "_callback", None), "__func__", None) is not _IDLE_CALLBACK
        for h in ready
    )


_IDLE_CALLBACK = VirtualClock._on_idle
