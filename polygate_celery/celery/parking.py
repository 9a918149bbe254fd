"""Celery edge: parking a deferred task's message, and the release loop that publishes it.

A deferred task's message (exactly as Celery would publish it: body, headers,
properties, exchange and routing key; nothing else Celery publishes beside it,
such as a task-sent event) is parked in a sorted set by due time, so a mass
deferral sits in Redis rather than in worker memory, and no ETA message
outlives the broker's visibility timeout. The lot is named by the app and the
broker it returns to (`lot_name`): apps that share a store prefix never
release each other's tasks into the wrong broker. Every worker process runs a
release loop: claim due entries (with a lease) → publish each, unchanged, with
kombu (on RabbitMQ with publisher confirms: the publish returns once the broker
holds the message, and raises if it refuses it) → confirm. A confirmed entry
stays until the run it starts begins (the run's guard forgets it), and is
released again after `release_check_s` if no run began, each later time after
twice as long (at most 32 times): a message the broker lost in delivery is not
lost, and one only queued behind a long backlog is copied a few times, not once
per check. A releaser that dies mid-release loses nothing
(the lease ends and another takes over), and a copy that this might publish
twice is dropped when it runs (`guard`). An entry that is not a message a
Celery worker can take (`parked_message` checks it as the worker reads it), or
whose publish fails for its own fault, goes whole to the lot's dead letters
(``:dead``, shown by ``polygate-celery status``) once, and its round goes on.
An outage's entries are also indexed by scope: a success of the scope makes them
due at once, and while they are all parked the release loop makes the earliest
due about once per probe interval, so the scope is probed (`Lot.wake`). The
entries of a priority class starved by others while the scope served them are
indexed by scope and class instead (`starved_index`): a success of a call of that
class makes them due, and the earliest is made due about once per stall window.
While Redis or the broker is unreachable the loop backs off (bounded, jittered)
and logs once when it starts failing and once when it recovers.

The lot's operations are `state.Lot`'s (on Redis: `state.redis.ParkingLot`, also
importable from here; in memory: `state.memory.MemoryLot`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from amqp.exceptions import ConnectionError as AMQPConnectionError
from amqp.exceptions import MessageNacked
from celery import Celery
from celery.canvas import Signature
from kombu.exceptions import OperationalError
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from polygate_celery.celery.parked_message import PUBLISH_FIELDS, entry_error, no_route
from polygate_celery.celery.state import Lot, ParkingLot
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.models import DeferralConfig
from polygate_celery.core.backoff import backoff_delay

__all__ = [
    "MAX_FAILED_RELEASES",
    "ParkingLot",
    "Releaser",
    "broker_retrying",
    "capture_message",
    "lot_name",
    "publish_message",
]
logger = logging.getLogger("polygate_celery")
TRANSIENT_BROKER_ERRORS = (OperationalError, ConnectionError, OSError, TimeoutError)
_PLUMBING = {"retry", "retry_policy", "declare", "timeout", "confirm_timeout"}
RELEASE_BACKOFF_MAX_S = 30.0  # the longest pause of a release loop that keeps failing
PROBE_LOOK_S = 1.0  # how often a release loop looks for a scope to probe


def broker_retrying() -> Retrying:
    """Bounded retries of a publish through a transient broker error (about 5 s at most)."""
    return Retrying(
        retry=retry_if_exception_type(TRANSIENT_BROKER_ERRORS),
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
        if self.message is not None:
            return  # published after the task message (a task-sent event): not the task
        fields = {name: kwargs.pop(name, None) for name in PUBLISH_FIELDS}
        properties = {k: v for k, v in kwargs.items() if k not in _PLUMBING}
        self.message = {"body": body, **fields, "properties": properties}


def capture_message(signature: Signature) -> dict[str, Any]:
    """The message `signature.apply_async()` would publish, as JSON-ready data."""
    producer = _CapturingProducer()
    signature.apply_async(producer=producer)  # type: ignore[arg-type]
    if producer.message is None:
        raise RuntimeError("Celery published nothing to capture")
    return producer.message


def publish_message(
    app: Celery, message: dict[str, Any], confirm_timeout_s: float | None = None
) -> None:
    """Publish a captured message unchanged, retrying transient broker errors.

    On RabbitMQ (``confirm_publish``, set by `configure_worker`) it returns once the
    broker confirms the message, waiting `confirm_timeout_s` at most; a refused
    publish (``MessageNacked``) or a confirm that never comes raises.
    """
    for attempt in broker_retrying():
        with attempt, app.producer_pool.acquire(block=True) as producer:
            try:
                producer.publish(
                    message["body"],
                    exchange=message["exchange"],
                    routing_key=message["routing_key"],
                    serializer=message["serializer"],
                    compression=message["compression"],
                    delivery_mode=message["delivery_mode"],
                    headers=message["headers"],
                    retry=False,
                    confirm_timeout=confirm_timeout_s,
                    **message["properties"],
                )
            except Exception:
                _drop_confirming(producer.connection)
                raise


def _drop_confirming(connection: Any) -> None:
    """Drop a confirming connection whose publish failed: a confirm still due would be
    taken for the next publish's on it. The pool connects again."""
    options = getattr(connection, "transport_options", None) or {}
    if options.get("confirm_publish"):
        with contextlib.suppress(Exception):
            connection.collect()


def starved_index(scope: str, priority: str) -> str:
    """What a lot indexes the tasks of class `priority` starved in `scope` under, beside
    the scope's own index (an outage's); configured names never hold an ``@``."""
    return f"{scope}@{priority}"


# A scope's parked tasks send it a probe at least this often (SPEC §5: a source that
# recovers gets traffic back within about one probe interval, <= 15 s by default).
PROBE_INTERVAL_MAX_S = 15.0


def probe_intervals(config: GatewayConfig) -> dict[str, float]:
    """Per scope, how often one of its parked tasks comes back to probe it while an outage
    has parked them all: its sources' shortest breaker cooldown, at most 15 s; per scope
    and class, while other classes starve it: the scope's governed stall window."""
    intervals = {
        name: min(
            [PROBE_INTERVAL_MAX_S]
            + [config.sources[s].breaker.cooldown_s for s in scope.sources if s in config.sources]
        )
        for name, scope in config.scopes.items()
    }
    for name, scope in config.for_governed_tasks().scopes.items():
        for priority in config.priorities:
            intervals[starved_index(name, priority)] = scope.stall_window_s
    return intervals


def lot_name(app: Celery) -> str:
    """``<main>@<broker>``: the app's name and a digest of its broker's address (without
    its password), so that a parked task returns to the broker it came from."""
    broker = app.connection_for_write().as_uri()  # the password masked
    digest = hashlib.sha256(broker.encode()).hexdigest()[:12]
    return f"{app.main or 'default'}@{digest}"


class Releaser:
    """One worker process's release loop, running on the runtime's event loop."""

    def __init__(
        self,
        app: Celery,
        lot: Lot,
        config: DeferralConfig,
        *,
        keep: bool = True,
        probes: Mapping[str, float] | None = None,
    ) -> None:
        self.app = app
        self.lot = lot
        self.config = config
        self.probes = dict(probes or {})  # scope -> probe interval (`Lot.wake`)
        self._probed_at = -math.inf
        self.keep_s = config.release_check_s if keep else 0.0
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
        failed = 0  # rounds failed in a row
        while not self._stopped:
            released = 0
            try:
                await self.wake_probes(loop)
                released = await self.release_due(loop)
            except Exception as exc:  # the loop must outlive any one round's failure
                if failed == 0:
                    logger.warning(
                        "releasing parked tasks failed (%s: %s); backing off until it works",
                        type(exc).__name__,
                        exc,
                    )
                failed += 1
                await asyncio.sleep(self.backoff_s(failed))
                continue
            if failed:
                logger.warning("releasing parked tasks works again after %d failed rounds", failed)
                failed = 0
            if released < self.config.release_batch:
                await asyncio.sleep(self.config.release_interval_s * random.uniform(0.5, 1.0))

    async def wake_probes(self, loop: asyncio.AbstractEventLoop) -> None:
        """At most once a second: for each scope whose outage parked tasks, make the
        earliest due now if none would come back within the scope's probe interval, so
        that someone probes the scope while all its tasks are parked."""
        now = loop.time()
        if now - self._probed_at < PROBE_LOOK_S:
            return
        self._probed_at = now
        for scope, interval in self.probes.items():
            if await self.lot.wake(scope, interval):
                logger.info("scope %r: a parked task comes back to probe it", scope)

    def backoff_s(self, failed: int) -> float:
        """The pause after `failed` failed rounds in a row: doubling from the release
        interval up to `RELEASE_BACKOFF_MAX_S`, jittered."""
        base = self.config.release_interval_s
        return backoff_delay(failed, base, max(base, RELEASE_BACKOFF_MAX_S), random.random())

    async def release_due(self, loop: asyncio.AbstractEventLoop | None = None) -> int:
        """One round: claim what is due, publish it in order (one hand-off to a thread
        for the round), confirm what went out (one script). Returns how many went out.

        Each entry is checked as Celery's worker would read it, and its route as the
        broker would take it, before it is published: one that fails, or whose publish
        fails for its own fault, goes to the dead letters and the round goes on. A
        publish the broker refuses (a nack) leaves that entry claimed, due again when
        the lease ends, and the round goes on (a round of nothing but refusals raises).
        A publish that finds the broker unreachable (after `publish_message`'s retries)
        ends the round: what went out is confirmed, the rest stay claimed, and it
        raises (the loop backs off). A publish error of no known kind counts against
        its entry, which is buried after `MAX_FAILED_RELEASES` of them. A releaser lost
        before it confirms leaves its round's published entries to be released again
        at the lease's end; each copy is dropped by its run's guard.
        """
        loop = loop or asyncio.get_running_loop()
        claimed = await self.lot.claim(
            self.config.release_batch, self.config.claim_lease_s, self.token
        )
        if not claimed:
            return 0
        outcomes = await loop.run_in_executor(
            None,
            _publish_each,
            self.app,
            [message for _, message in claimed],
            self.config.claim_lease_s,
        )
        sent = [e for (e, _), (kind, _) in zip(claimed, outcomes, strict=False) if kind == SENT]
        if sent:
            await self.lot.confirm_all(sent, self.token, self.keep_s)
        broker_error: BaseException | None = None
        held = 0  # entries left claimed for the broker's fault (due again at lease end)
        for (entry, _), (kind, failure) in zip(claimed, outcomes, strict=False):
            if kind == ENTRY_FAULT:
                await self.lot.bury(entry, self.token, str(failure))
            elif kind == UNKNOWN_ERROR:
                await self.lot.unpublished(
                    entry, self.token, MAX_FAILED_RELEASES, type(failure).__name__
                )
            elif kind == BROKER_ERROR and isinstance(failure, BaseException):
                broker_error, held = failure, held + 1
        held += len(claimed) - len(outcomes)  # not tried: the broker was unreachable
        down = broker_error is not None and not isinstance(broker_error, MessageNacked)
        if broker_error is not None and (down or not sent):
            raise broker_error  # the loop backs off, and logs once
        if held:
            logger.warning(
                "%d parked tasks not released this round (%s); due again in %.0f s",
                held,
                type(broker_error).__name__,
                self.config.claim_lease_s,
            )
        return len(sent)


SENT, ENTRY_FAULT, BROKER_ERROR, UNKNOWN_ERROR = "sent", "entry", "broker", "unknown"
MAX_FAILED_RELEASES = 5  # releases failed with an error of no known kind, before burial
# The broker's own errors: the message may go out once it is back.
_BROKER_ERRORS = (*TRANSIENT_BROKER_ERRORS, MessageNacked, AMQPConnectionError)


def _publish_each(
    app: Celery, messages: list[dict[str, Any]], confirm_timeout_s: float
) -> list[tuple[str, BaseException | str | None]]:
    """Publish `messages` in order, each after a check of its route: per message, its
    outcome (`SENT`, or a kind of failure and the error or reason). Stops after a
    publish that found the broker unreachable (the rest are not tried)."""
    outcomes: list[tuple[str, BaseException | str | None]] = []
    routes: dict[tuple[str, str], str | None] = {}
    for message in messages:
        route = (message["exchange"], message["routing_key"])
        try:
            if route not in routes:
                routes[route] = no_route(app, *route)
            why = routes[route]
            if why is None:
                publish_message(app, message, confirm_timeout_s)
        except Exception as exc:
            if entry_error(exc):
                outcomes.append((ENTRY_FAULT, f"the publish raised {type(exc).__name__}"))
            elif isinstance(exc, _BROKER_ERRORS):
                outcomes.append((BROKER_ERROR, exc))
                if not isinstance(exc, MessageNacked):
                    break  # unreachable after publish_message's retries: the round ends
            else:
                outcomes.append((UNKNOWN_ERROR, exc))
            continue
        outcomes.append((SENT, None) if why is None else (ENTRY_FAULT, why))
    return outcomes
