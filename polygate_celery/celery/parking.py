"""Celery edge: the Redis parking lot where deferred tasks wait until they are due.

A deferred task's message (exactly as Celery would publish it: body, headers,
properties, exchange and routing key) is parked in a sorted set by due time,
so a mass deferral sits in Redis rather than in worker memory, and no ETA
message outlives the broker's visibility timeout. Every worker process runs a
release loop: claim due entries (with a lease) → publish each, unchanged, with
kombu → confirm. A releaser that dies mid-release loses nothing (the lease
ends and another takes over), and a copy that this might publish twice is
dropped when it runs (`guard`, keyed by task id and deferral number).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections.abc import Iterator
from typing import Any

from celery import Celery, Task
from celery.canvas import Signature
from kombu.exceptions import OperationalError
from redis.asyncio import Redis
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from polygate_celery.config.models import DeferralConfig
from polygate_celery.errors import GovernanceBackendError
from polygate_celery.store.redis import KeySpace, LuaScript, lua_text, run_script

logger = logging.getLogger("polygate_celery")
_TRANSIENT_BROKER_ERRORS = (OperationalError, ConnectionError, OSError, TimeoutError)
# What a message keeps of Celery's publish arguments (the rest is per-publish plumbing).
_PUBLISH_FIELDS = (
    "exchange",
    "routing_key",
    "serializer",
    "compression",
    "delivery_mode",
    "headers",
)
_PLUMBING = {"retry", "retry_policy", "declare", "timeout", "confirm_timeout"}


def _scripts() -> dict[str, LuaScript]:
    package = "polygate_celery.celery"
    return {name: LuaScript(lua_text(package, name)) for name in ("park", "claim", "confirm")}


def broker_retrying() -> Retrying:
    """Bounded retries of a publish through a transient broker error (about 5 s at most)."""
    return Retrying(
        retry=retry_if_exception_type(_TRANSIENT_BROKER_ERRORS),
        stop=stop_after_attempt(5) | stop_after_delay(5),
        wait=wait_random_exponential(multiplier=0.1, max=1.0),
        reraise=True,
    )


class _Connection:
    @contextlib.contextmanager
    def _reraise_as_library_errors(self) -> Iterator[None]:
        yield


class _CapturingProducer:
    """Takes the place of a kombu producer to keep the message Celery would publish."""

    connection = _Connection()

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None

    def publish(self, body: Any, **kwargs: Any) -> None:
        fields = {name: kwargs.pop(name, None) for name in _PUBLISH_FIELDS}
        properties = {k: v for k, v in kwargs.items() if k not in _PLUMBING}
        self.message = {"body": body, **fields, "properties": properties}


def capture_message(signature: Signature) -> dict[str, Any]:
    """The message `signature.apply_async()` would publish, as JSON-ready data."""
    producer = _CapturingProducer()
    signature.apply_async(producer=producer)  # type: ignore[arg-type]
    if producer.message is None:
        raise RuntimeError("Celery published nothing to capture")
    return producer.message


def publish_message(app: Celery, message: dict[str, Any]) -> None:
    """Publish a captured message unchanged, retrying transient broker errors."""
    for attempt in broker_retrying():
        with attempt, app.producer_pool.acquire(block=True) as producer:
            producer.publish(
                message["body"],
                exchange=message["exchange"],
                routing_key=message["routing_key"],
                serializer=message["serializer"],
                compression=message["compression"],
                delivery_mode=message["delivery_mode"],
                headers=message["headers"],
                retry=False,
                **message["properties"],
            )


class ParkingLot:
    """One app's lot (three keys under the store's prefix), and its scripts.

    The lot is per Celery app (its main name): apps that share a store prefix,
    to share permits, never release each other's tasks into the wrong broker.
    """

    def __init__(self, client: Redis, keys: KeySpace, app_name: str = "default") -> None:
        self.client = client
        self.base = keys.base
        lot = keys.parked(app_name)
        self.keys = [lot, f"{lot}:msg", f"{lot}:claim"]
        self._scripts = _scripts()

    async def park(
        self, entry_id: str, due_in_s: float, message: dict[str, Any], done_ttl_s: float
    ) -> None:
        """Park `entry_id` ("<task id>:<n + 1>") and mark run n of the task finished."""
        task_id, _, deferral = entry_id.rpartition(":")
        deferring_run = f"{self.base}:done:{task_id}:{int(deferral) - 1}"
        await run_script(
            self._scripts["park"],
            self.client,
            [*self.keys[:2], deferring_run],
            [entry_id, repr(max(0.0, due_in_s)), json.dumps(message), repr(done_ttl_s)],
        )

    async def claim(
        self, limit: int, lease_s: float, token: str
    ) -> list[tuple[str, dict[str, Any]]]:
        reply = await run_script(
            self._scripts["claim"], self.client, self.keys, [limit, repr(lease_s), token]
        )
        claimed = []
        for entry_id, text in zip(reply[::2], reply[1::2], strict=True):
            try:
                claimed.append((str(entry_id), json.loads(text)))
            except ValueError:
                logger.error("parked entry %s is not a message; it is skipped", entry_id)
        return claimed

    async def confirm(self, entry_id: str, token: str) -> bool:
        reply = await run_script(
            self._scripts["confirm"], self.client, self.keys, [entry_id, token]
        )
        return bool(int(reply))

    async def size(self) -> int:
        try:
            return int(await self.client.zcard(self.keys[0]))
        except Exception as exc:
            raise GovernanceBackendError(f"{type(exc).__name__}: {exc}") from exc


class Releaser:
    """One worker process's release loop, running on the runtime's event loop."""

    def __init__(self, app: Celery, lot: ParkingLot, config: DeferralConfig) -> None:
        self.app = app
        self.lot = lot
        self.config = config
        self.token = uuid.uuid4().hex
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        def begin() -> None:
            if self._task is None or self._task.done():
                self._task = loop.create_task(self._run())

        loop.call_soon_threadsafe(begin)

    def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopped:
            released = 0
            try:
                released = await self.release_due(loop)
            except Exception:  # the loop must outlive any one round's failure
                logger.warning("releasing parked tasks failed; retrying", exc_info=True)
            if released < self.config.release_batch:
                await asyncio.sleep(self.config.release_interval_s * random.uniform(0.5, 1.0))

    async def release_due(self, loop: asyncio.AbstractEventLoop | None = None) -> int:
        """One round: claim what is due, publish it, confirm it. Returns how many went out."""
        loop = loop or asyncio.get_running_loop()
        claimed = await self.lot.claim(
            self.config.release_batch, self.config.claim_lease_s, self.token
        )
        released = 0
        for entry_id, message in claimed:
            try:
                await loop.run_in_executor(None, publish_message, self.app, message)
            except Exception:
                # Left claimed: due again when the lease ends, for any releaser.
                logger.warning("publishing parked task %s failed", entry_id, exc_info=True)
                continue
            await self.lot.confirm(entry_id, self.token)
            released += 1
        return released


def entry_id(task: Task[Any, Any], deferral: int) -> str:
    return f"{task.request.id}:{deferral}"
