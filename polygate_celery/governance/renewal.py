"""Governance layer: one background task per gateway renewing what its calls hold, in batches.

The lease renewer (`polygate_celery.governance.lease`) and the place keeper
(`polygate_celery.governance.places`) each run one task that renews every lease
or queue place of the gateway's calls in one store call, so the cost does not
grow with the number of calls. The task lives on the event loop of the calls it
serves: it starts with the first thing held and starts again on another loop
(a gateway used from a fresh `asyncio.run`) or after it ended.
"""

from __future__ import annotations

import asyncio

from polygate_celery.clock import Clock
from polygate_celery.store.base import Store


class BatchRenewer:
    """The task, its wake-up and its end; a subclass says what one run does (`_run`)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ensure_running(self) -> None:
        """Start the task on the running loop unless it runs there already."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop, self._wake = loop, asyncio.Event()
            self._task = loop.create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})

    async def _run(self) -> None:
        raise NotImplementedError
