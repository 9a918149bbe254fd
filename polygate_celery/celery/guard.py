"""Celery edge: one live run per task message, and a cap on messages that kill workers.

Every governed run sets a marker under its run identity (`identity`) and keeps
it alive with a heartbeat from its worker process. A copy of the message (the
broker redelivered it, or a release published it twice) finds one of three
things: the run finished for good (the copy is dropped), the run's heartbeat
alive (the copy waits in the parking lot and looks again later: on a pool that
cannot stop the live run, such as threads after a broker blip, it must not run
beside it), or neither (the run died with its worker: the copy runs). A run is
marked finished only when its outcome is final; a run Celery terminates
(``SystemExit`` at a cold shutdown or on broker connection loss) only drops
its marker, so the copy Celery restores runs. A message whose runs died more
than `redelivery_cap` times fails instead of killing workers forever.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from celery import Task, states

from polygate_celery.celery.chords import count_stored_part
from polygate_celery.celery.identity import COPY, RunIdentity
from polygate_celery.celery.parking import lot_name
from polygate_celery.celery.runtime import WorkerRuntime
from polygate_celery.errors import GovernanceBackendError, StoreUnreachable
from polygate_celery.store.redis import LuaScript, lua_text, run_script

Verdict = Literal["go", "done", "running", "poison"]
logger = logging.getLogger("polygate_celery")
_EXECUTION = LuaScript(lua_text("polygate_celery.celery", "execution"))
_HEARTBEAT = LuaScript(lua_text("polygate_celery.celery", "heartbeat"))


def run_keys(base: str, run: RunIdentity) -> list[str]:
    return [f"{base}:run:{run.key}", f"{base}:done:{run.key}", f"{base}:redeliveries:{run.key}"]


class ExecutionGuard:
    def __init__(self, runtime: WorkerRuntime, task: Task[Any, Any], run: RunIdentity) -> None:
        self.runtime = runtime
        request = task.request
        headers = request.headers or {}
        redelivered = bool((request.delivery_info or {}).get("redelivered"))
        self.copy = redelivered or bool(headers.get(COPY))
        self.run = run
        self.active = runtime.redis is not None and runtime.keys is not None
        self.token = uuid.uuid4().hex
        self.keys = run_keys(runtime.keys.base, run) if self.active else []
        config = runtime.config.deferral
        self._run_ttl_ms = int(config.heartbeat_s * 1000 * HEARTBEATS_PER_TTL)
        self._done_ttl = config.max_defer_age_s
        self._cap = config.redelivery_cap
        self.wait_s = 0.0  # after "running": how long until the live run's marker lapses
        self.task = task
        self.lot: list[str] | None = None
        if self.active and (run.deferrals > 0 or self.copy):  # may come from a parking lot
            lot = runtime.keys.parked(lot_name(task.app))
            self.lot = [lot, f"{lot}:msg"]

    def begin(self) -> Verdict:
        if not self.active:
            return "go"
        reply = self._call("begin")
        verdict: Verdict = _text(reply[0])  # type: ignore[assignment]
        if verdict == "running":
            self.wait_s = max(0.0, int(reply[1]) / 1000)
        elif verdict == "go":
            heartbeat_of(self.runtime).add(self.keys[0], self.token)
            stored = (
                outcome_stored_since(self.task, float(_text(reply[1]))) if len(reply) > 1 else None
            )
            if stored is not None:
                # An earlier run of this message stored its outcome, then died before
                # marking itself finished: running again would store (and count toward
                # a chord) a second outcome. It may have died before counting this
                # one toward its chord: that count is made here.
                count_stored_part(self.task, self.task.request, stored)
                quietly(self.finish)
                return "done"
        return verdict

    def finish(self) -> None:
        """This message's outcome is final (success, failure, deferred): copies are dropped."""
        self._end("finish")

    def release(self) -> None:
        """This run ended but its message goes on (Celery terminated it): the next copy runs."""
        self._end("release")

    def hand_back(self) -> None:
        """This run ended and its message went back to the broker unfinished (a retry
        the broker did not take): the next copy runs, counted toward the cap."""
        self._end("handback")

    def forget(self) -> None:
        """The run was ended in the store by another step (parking its deferral)."""
        if self.active:
            heartbeat_of(self.runtime).discard(self.keys[0], self.token)

    def _end(self, mode: str) -> None:
        if self.active:
            heartbeat_of(self.runtime).discard(self.keys[0], self.token)
            self._call(mode)

    def _call(self, mode: str) -> Any:
        """One execution.lua step, from the task's own thread (no hop to the loop)."""
        ttls: list[str | int] = [self._run_ttl_ms, repr(self._done_ttl)]
        args: list[str | int] = [mode, self.token, *ttls, int(self.copy), self._cap]
        keys = self.keys
        if mode == "begin":
            args.append(repr(time.time()))  # the clock Celery's date_done is read from
            if self.lot is not None:
                keys = [*keys, *self.lot]  # the entry this message was released from, if any
                args.append(self.run.key)
        return _EXECUTION.run_blocking(self.runtime.blocking_redis, keys, args)


def outcome_stored_since(task: Task[Any, Any], began: float) -> dict[str, Any] | None:
    """The final outcome the result backend holds for `task`'s id, stored at or after
    `began` (epoch seconds, the storing worker's clock), or None. Unknown (no backend,
    results ignored, the backend unreachable) counts as not stored: the run goes on."""
    if task.ignore_result or getattr(task.request, "ignore_result", False):
        return None
    try:
        meta = task.backend.get_task_meta(str(task.request.id), cache=False)
    except Exception as exc:
        logger.warning(
            "task %s: its result backend could not say whether an earlier run of the "
            "message stored an outcome (%s); running it again",
            task.request.id,
            type(exc).__name__,
        )
        return None
    if meta.get("status") not in states.READY_STATES:
        return None
    done = meta.get("date_done")
    if isinstance(done, str):
        try:
            done = datetime.fromisoformat(done)
        except ValueError:
            return None
    if not isinstance(done, datetime):
        return None
    if done.tzinfo is None:
        done = done.replace(tzinfo=UTC)
    return meta if done.timestamp() >= began else None


FINISH_PATIENCE_S = 30.0
"""How long a finished run waits for Redis to record it (about Celery's publish retry):
a run whose result was stored while Redis restarted must not run again for want of it."""


def patiently(
    step: Callable[[], Any],
    *,
    within_s: float = FINISH_PATIENCE_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run `step`, retrying for `within_s` while it raises `StoreUnreachable` (backing off
    from 0.1 s to 2 s), as Celery's result backend does for the outcome it just stored."""
    deadline = clock() + within_s
    delay = 0.1
    while True:
        try:
            step()
            return
        except Exception as exc:
            if not isinstance(exc, StoreUnreachable):
                logger.warning("recording a governed task's run failed", exc_info=True)
                return
            if clock() + delay > deadline:
                logger.warning(
                    "recording a governed task's run failed for %gs: Redis unreachable; a copy "
                    "of its message may run again",
                    within_s,
                )
                return
            sleep(delay)
            delay = min(delay * 2, 2.0)


def quietly(step: Callable[[], Any]) -> None:
    """A run marker only holds copies back: failing to write one loses nothing."""
    try:
        step()
    except Exception:
        logger.warning("recording a governed task's run failed", exc_info=True)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# A run marker outlives this many missed heartbeats before its run counts as dead.
HEARTBEATS_PER_TTL = 5


class Heartbeat:
    """Keeps the run markers of one worker process's live runs alive, in one script a beat.

    Runs on the runtime's event loop; a beat that fails (Redis unreachable) is
    logged once per outage, and the markers are set again when Redis answers.
    """

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.interval_s = runtime.config.deferral.heartbeat_s
        self.live: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing = 0

    def add(self, key: str, token: str) -> None:
        self.live[key] = token
        if self._task is None:
            self.runtime.on_loop(self._start())

    def discard(self, key: str, token: str) -> None:
        if self.live.get(key) == token:  # not a newer run's of the same key
            self.live.pop(key, None)

    def stop(self) -> None:
        if self._task is not None:
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)

    async def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._beat_forever())

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s * random.uniform(0.8, 1.0))
            live = dict(self.live)
            if live:
                await self.beat(live)

    async def beat(self, live: dict[str, str]) -> None:
        assert self.runtime.redis is not None
        ttl_ms = int(self.interval_s * 1000 * HEARTBEATS_PER_TTL)
        try:
            taken = await run_script(
                _HEARTBEAT, self.runtime.redis, list(live), [ttl_ms, *live.values()]
            )
        except GovernanceBackendError as exc:
            if self._failing == 0:
                logger.warning("run heartbeats failed (%s); retrying every beat", exc)
            self._failing += 1
            return
        if self._failing:
            logger.warning("run heartbeats resumed after %d failed beats", self._failing)
            self._failing = 0
        if int(taken):
            logger.error("%d live runs found their marker taken by another run", int(taken))


def heartbeat_of(runtime: WorkerRuntime) -> Heartbeat:
    """The runtime's heartbeat, made on first use."""
    with runtime.making:
        if runtime.heartbeat is None:
            runtime.heartbeat = Heartbeat(runtime)
            runtime.add_service(runtime.heartbeat)
        return runtime.heartbeat
