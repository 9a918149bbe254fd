"""Store layer (Redis): waking a waiting call when another process hands it a permit.

A release that hands its permit to a call queued in another process publishes
the call on that process's wake-up channel (``<wake key><origin>``); the
process's listener wakes the call's watch (`ReleaseHub.wake_call`). Waking early
is an optimisation: a hand-over missed meanwhile is found when its waiter's
place is next kept (governance.places). An admission that takes a quota slot
another process's call booked, and books that call another, tells it the same way
(`ReleaseHub.move_call`); a move missed is found when the call asks at its old slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster

from polygate_celery.store.redis.connect import AsyncClient, cluster_node_client
from polygate_celery.store.redis.keys import KeySpace
from polygate_celery.store.releases import ReleaseHub

logger = logging.getLogger("polygate_celery")


class _WakeUps:
    """One process's wake-up channel: subscribed from the first time a caller here
    waits, listened to until the store closes.

    `warm` loads a cluster client's slot table before its first command (the store's,
    shared with its scripts).
    """

    def __init__(
        self,
        client: AsyncClient,
        keys: KeySpace,
        origin: str,
        releases: ReleaseHub,
        warm: Callable[[], Awaitable[None]],
    ) -> None:
        self._client = client
        self.keys = keys
        self._origin = origin
        self._releases = releases
        self._warm = warm
        self._listener: asyncio.Task[None] | None = None
        self._closed = False
        self.subscribed = asyncio.Event()  # set while the channel is heard

    def stop(self) -> None:
        """Listen no more (the listener ends at its next look; `aclose` ends it now)."""
        self._closed = True

    async def aclose(self) -> None:
        """Stop listening and end the listener."""
        self._closed = True
        if self._listener is not None:
            self._listener.cancel()
            # redis-py may swallow a cancellation while it connects; the loop also
            # checks `_closed`, and a listener stuck in I/O is not waited for long.
            await asyncio.wait({self._listener}, timeout=2.0)
            self._listener = None

    def listen(self) -> None:
        """Subscribe to this process's wake-up channel, from the first time a caller here
        waits (a process whose calls never wait never subscribes).

        A message sent before the subscription is lost, not the permit: once the
        subscription is confirmed (and again after each reconnection), the queued
        calls here that were handed a permit meanwhile are woken (`_wake_handed`).
        """
        if not self._closed and (self._listener is None or self._listener.done()):
            self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        """Wake the waiter here another process's release handed a permit to."""
        attempt = 0
        while not self._closed:
            try:
                async with self._subscription(attempt) as pubsub:
                    await pubsub.subscribe(self.keys.wake + self._origin)
                    quiet_s = 0.0
                    while not self._closed:
                        message = await pubsub.get_message(timeout=1.0)
                        if message is None:
                            quiet_s += 1.0
                            if quiet_s >= 30:  # a silently dead connection fails the ping
                                await pubsub.ping()
                                quiet_s = 0.0
                            continue
                        quiet_s = 0.0
                        if message.get("type") == "message":
                            self._on_released(str(message.get("data", "")))
                        elif message.get("type") == "subscribe":  # heard from now on
                            self.subscribed.set()
                            await self._wake_handed()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.subscribed.clear()
                # Waking early is an optimisation: a hand-over missed meanwhile is
                # found when its waiter's place is next kept (governance.places).
                logger.debug("release listener lost its connection; retrying", exc_info=True)
                attempt += 1
                await asyncio.sleep(1.0)

    async def _wake_handed(self) -> None:
        """Wake the queued calls here that a release handed a permit to (one command per
        source); a failure is left to the keeping of their places."""
        try:
            for source, calls in self._releases.queued_calls().items():
                handed = [f"~{call}" for call in calls]
                scores = await self._client.zmscore(self.keys.permits(source), handed)
                for call, score in zip(calls, scores, strict=True):
                    if score is not None:
                        self._releases.wake_call(call, source)
        except Exception:
            logger.debug("looking for permits handed before listening failed", exc_info=True)

    @contextlib.asynccontextmanager
    async def _subscription(self, attempt: int) -> AsyncIterator[PubSub]:
        """A pub/sub connection: the client's own (a server, Sentinel's current master),
        or on a cluster one node's, the next node after each failure."""
        if not isinstance(self._client, RedisCluster):
            async with self._client.pubsub() as pubsub:
                yield pubsub
            return
        await self._warm()
        node = cluster_node_client(self._client, attempt)
        async with node, node.pubsub() as pubsub:
            yield pubsub

    def _on_released(self, data: str) -> None:
        """A permit handed to a call here (``<call> <source>``), or a quota slot a call
        here booked moved (``<call> <source> <seconds until the new one>``)."""
        call_id, source, *moved = data.split(" ")
        if not call_id or not source:
            return
        if not moved:
            self._releases.wake_call(call_id, source)
            return
        with contextlib.suppress(ValueError):
            self._releases.move_call(call_id, source, float(moved[0]))
