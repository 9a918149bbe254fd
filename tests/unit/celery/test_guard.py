"""The execution guard on the in-memory run markers: one live run per message, a copy of
a live run held back, of a finished one dropped, of a dead one run (up to the cap), an
outcome an earlier run stored before dying honoured, and no markers at all without a
Celery state."""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from polygate_celery.celery.guard import HEARTBEATS_PER_TTL, ExecutionGuard, Heartbeat
from polygate_celery.celery.identity import COPY, RunIdentity
from polygate_celery.celery.state import MemoryCeleryState
from polygate_celery.config.models import DeferralConfig
from polygate_celery.testing import VirtualClock
from tests.unit.celery.conftest import message

CONFIG = DeferralConfig(heartbeat_s=2.0, redelivery_cap=2)
RUN = RunIdentity("task-1", "sub", 0, 0)
NOW = 1_700_000_000.0  # the workers' wall clock


class Backend:
    """A result backend holding one stored outcome (or none)."""

    def __init__(self, meta: dict[str, Any] | None = None) -> None:
        self.meta = meta or {"status": "PENDING"}

    def get_task_meta(self, task_id: str, cache: bool = True) -> dict[str, Any]:
        return self.meta


def task(*, copy: bool = False, redelivered: bool = False, backend: Backend | None = None) -> Any:
    request = SimpleNamespace(
        id=RUN.task_id,
        headers={COPY: 1} if copy else {},
        delivery_info={"redelivered": redelivered},
        ignore_result=False,
        chord=None,
        group=None,
    )
    return SimpleNamespace(request=request, ignore_result=False, backend=backend or Backend())


def never_started(coroutine: Coroutine[Any, Any, None]) -> None:
    coroutine.close()  # the beat loop is not under test here


@pytest.fixture
def heartbeat(memory: MemoryCeleryState) -> Heartbeat:
    return Heartbeat(memory.markers, CONFIG.heartbeat_s, never_started)


def guard(
    memory: MemoryCeleryState, heartbeat: Heartbeat | None = None, **kwargs: Any
) -> ExecutionGuard:
    return ExecutionGuard(
        memory.markers,
        task(**kwargs),
        RUN,
        CONFIG,
        heartbeat=heartbeat,
        lot=lambda: "lot",
        wall_time=lambda: NOW,
    )


def test_a_first_run_goes_and_its_heartbeat_keeps_it(
    memory: MemoryCeleryState, heartbeat: Heartbeat
) -> None:
    first = guard(memory, heartbeat)
    assert first.begin() == "go"
    assert heartbeat.live == {RUN.key: first.token}
    first.finish()
    assert heartbeat.live == {}


def test_a_copy_of_a_live_run_waits_and_of_a_finished_one_is_dropped(
    memory: MemoryCeleryState,
) -> None:
    first = guard(memory)
    first.begin()
    held = guard(memory, redelivered=True)
    assert held.begin() == "running"
    assert held.wait_s == CONFIG.heartbeat_s * HEARTBEATS_PER_TTL
    first.finish()
    assert guard(memory, redelivered=True).begin() == "done"


def test_a_copy_of_a_dead_run_runs_until_the_cap(
    memory: MemoryCeleryState, clock: VirtualClock
) -> None:
    guard(memory).begin()  # its worker dies: no beat, no end
    for _ in range(CONFIG.redelivery_cap):
        clock.advance(CONFIG.heartbeat_s * HEARTBEATS_PER_TTL)
        assert guard(memory, redelivered=True).begin() == "go"
    clock.advance(CONFIG.heartbeat_s * HEARTBEATS_PER_TTL)
    assert guard(memory, redelivered=True).begin() == "poison"


async def test_a_beating_run_is_never_taken_for_dead(
    memory: MemoryCeleryState, clock: VirtualClock, heartbeat: Heartbeat
) -> None:
    first = guard(memory, heartbeat)
    first.begin()
    for _ in range(20):
        clock.advance(CONFIG.heartbeat_s)
        await heartbeat.beat(dict(heartbeat.live))
    assert guard(memory, redelivered=True).begin() == "running"


def test_a_terminated_runs_copy_runs_uncounted(memory: MemoryCeleryState) -> None:
    for _ in range(CONFIG.redelivery_cap + 2):
        run = guard(memory, redelivered=True)
        assert run.begin() == "go"
        run.release()


def test_a_handed_back_runs_copy_is_counted(memory: MemoryCeleryState) -> None:
    for _ in range(CONFIG.redelivery_cap):
        run = guard(memory, redelivered=True)
        assert run.begin() == "go"
        run.hand_back()
    assert guard(memory, redelivered=True).begin() == "poison"


def test_an_outcome_stored_before_the_run_died_ends_the_copy(
    memory: MemoryCeleryState, clock: VirtualClock
) -> None:
    guard(memory).begin()  # began at NOW, stored its outcome, died before finishing
    clock.advance(CONFIG.heartbeat_s * HEARTBEATS_PER_TTL)
    stored = datetime.fromtimestamp(NOW + 1, UTC).isoformat()
    backend = Backend({"status": "SUCCESS", "date_done": stored, "result": 1})
    assert guard(memory, redelivered=True, backend=backend).begin() == "done"
    assert guard(memory, redelivered=True).begin() == "done"  # finished for good


def test_an_outcome_stored_before_the_run_began_is_an_earlier_submissions(
    memory: MemoryCeleryState, clock: VirtualClock
) -> None:
    guard(memory).begin()
    clock.advance(CONFIG.heartbeat_s * HEARTBEATS_PER_TTL)
    stored = datetime.fromtimestamp(NOW - 60, UTC).isoformat()
    backend = Backend({"status": "SUCCESS", "date_done": stored})
    assert guard(memory, redelivered=True, backend=backend).begin() == "go"


async def test_a_released_run_forgets_the_lot_entry_it_came_from(
    memory: MemoryCeleryState,
) -> None:
    lot = memory.lot("lot")
    await lot.park(RUN.key, 0.0, message(RUN.key), 600.0)
    await lot.park(f"{RUN.key}:copy", 0.0, message("copy"), 600.0)
    assert guard(memory, copy=True).begin() == "go"
    assert await lot.size() == 0


async def test_a_parked_deferral_ends_the_run_in_the_same_step(
    memory: MemoryCeleryState, heartbeat: Heartbeat
) -> None:
    deferring = guard(memory, heartbeat)
    deferring.begin()
    await memory.lot("lot").park("next", 60.0, message("next"), 600.0, deferring.ending)
    deferring.forget()
    assert heartbeat.live == {}
    assert guard(memory, redelivered=True).begin() == "done"


def test_without_a_celery_state_every_run_goes(memory: MemoryCeleryState) -> None:
    for _ in range(3):
        bare = ExecutionGuard(None, task(redelivered=True), RUN, CONFIG)
        assert (bare.begin(), bare.ending, bare.lot) == ("go", None, None)
        bare.finish()
