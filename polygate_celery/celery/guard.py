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
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from celery import Task, states

from polygate_celery.celery.chords import count_stored_part
from polygate_celery.celery.identity import COPY, RunIdentity
from polygate_celery.celery.parking import lot_name
from polygate_celery.celery.runtime import WorkerRuntime
from polygate_celery.celery.state import (
    EndMode,
    MarkerTerms,
    RunEnding,
    RunMarkers,
    RunStart,
    Verdict,
)
from polygate_celery.config.models import DeferralConfig
from polygate_celery.errors import GovernanceBackendError, StoreUnreachable

logger = logging.getLogger("polygate_celery")


class ExecutionGuard:
    """One run's marker: begun before the body, ended once its outcome is known.

    `markers` None (no Redis store): every run goes, and ending it records nothing.
    A run that may have come from a parking lot (deferred before, or a copy) asks
    `lot` for the lot's name: the entries that started it are forgotten as it begins.
    """

    def __init__(
        self,
        markers: RunMarkers | None,
        task: Task[Any, Any],
        run: RunIdentity,
        config: DeferralConfig,
        *,
        heartbeat: Heartbeat | None = None,
        lot: Callable[[], str] | None = None,
        wall_time: Callable[[], float] = time.time,
    ) -> None:
        request = task.request
        headers = request.headers or {}
        redelivered = bool((request.delivery_info or {}).get("redelivered"))
        self.copy = redelivered or bool(headers.get(COPY))
        self.run = run
        self.markers = markers
        self.active = markers is not None
        self.token = uuid.uuid4().hex
        self.terms = MarkerTerms(
            config.heartbeat_s * HEARTBEATS_PER_TTL, config.max_defer_age_s, config.redelivery_cap
        )
        self.wait_s = 0.0  # after "running": how long until the live run's marker lapses
        self.task = task
        self.heartbeat = heartbeat
        may_be_parked = self.active and (run.deferrals > 0 or self.copy)
        self.lot = lot() if lot is not None and may_be_parked else None
        self._wall_time = wall_time

    @classmethod
    def of(cls, runtime: WorkerRuntime, task: Task[Any, Any], run: RunIdentity) -> ExecutionGuard:
        """The guard of `run` in `runtime`'s process: its run markers and heartbeat."""
        state = runtime.state
        return cls(
            state.markers if state is not None else None,
            task,
            run,
            runtime.config.deferral,
            heartbeat=heartbeat_of(runtime) if state is not None else None,
            lot=lambda: lot_name(task.app),
            wall_time=runtime.wall_time,
        )

    @property
    def ending(self) -> RunEnding | None:
        """(run, token) for a step that ends this run elsewhere (parking its deferral)."""
        return (self.run.key, self.token) if self.active else None

    def begin(self) -> Verdict:
        if self.markers is None:
            return "go"
        # The wall clock is what Celery's date_done is read from.
        begun = self.markers.begin(
            RunStart(self.run.key, self.token, self.copy, self.terms, self._wall_time(), self.lot)
        )
        if begun.verdict == "running":
            self.wait_s = begun.wait_s
        elif begun.verdict == "go":
            if self.heartbeat is not None:
                self.heartbeat.add(self.run.key, self.token)
            stored = (
                outcome_stored_since(self.task, begun.began_at)
                if begun.began_at is not None
                else None
            )
            if stored is not None:
                # An earlier run of this message stored its outcome, then died before
                # marking itself finished: running again would store (and count toward
                # a chord) a second outcome. It may have died before counting this
                # one toward its chord: that count is made here.
                count_stored_part(self.task, self.task.request, stored)
                quietly(self.finish)
                return "done"
        return begun.verdict

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
        if self.heartbeat is not None:
            self.heartbeat.discard(self.run.key, self.token)

    def _end(self, mode: EndMode) -> None:
        if self.markers is not None:
            self.forget()
            self.markers.end(self.run.key, self.token, mode, self.terms)


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


# A run marker outlives this many missed heartbeats before its run counts as dead.
HEARTBEATS_PER_TTL = 5


class Heartbeat:
    """Keeps the run markers of one worker process's live runs alive, in one step a beat.

    Runs on the runtime's event loop (`on_loop` starts a coroutine there); a beat that
    fails (Redis unreachable) is logged once per outage, and the markers are set again
    when Redis answers.
    """

    def __init__(
        self,
        markers: RunMarkers,
        interval_s: float,
        on_loop: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self.markers = markers
        self.interval_s = interval_s
        self.live: dict[str, str] = {}  # run -> its token
        self._on_loop = on_loop
        self._task: asyncio.Task[None] | None = None
        self._failing = 0

    def add(self, run: str, token: str) -> None:
        self.live[run] = token
        if self._task is None:
            self._on_loop(self._start())

    def discard(self, run: str, token: str) -> None:
        if self.live.get(run) == token:  # not a newer run's of the same key
            self.live.pop(run, None)

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
        try:
            taken = await self.markers.beat(live, self.interval_s * HEARTBEATS_PER_TTL)
        except GovernanceBackendError as exc:
            if self._failing == 0:
                logger.warning("run heartbeats failed (%s); retrying every beat", exc)
            self._failing += 1
            return
        if self._failing:
            logger.warning("run heartbeats resumed after %d failed beats", self._failing)
            self._failing = 0
        if taken:
            logger.error("%d live runs found their marker taken by another run", taken)


def heartbeat_of(runtime: WorkerRuntime) -> Heartbeat:
    """The runtime's heartbeat, made on first use (the runtime has a Celery state)."""
    assert runtime.state is not None
    with runtime.making:
        if runtime.heartbeat is None:
            interval = runtime.config.deferral.heartbeat_s
            runtime.heartbeat = Heartbeat(runtime.state.markers, interval, runtime.on_loop)
            runtime.add_service(runtime.heartbeat)
        return runtime.heartbeat
