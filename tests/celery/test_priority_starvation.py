"""A task of a lower class starved by a higher one parks instead of holding its worker
slot (SPEC §8, stall per class): its call's stall verdict reads its own class's
progress while the scope serves the higher class; once the higher class's demand ends
it runs again, and its call is sent once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from polygate_celery.celery.parking import lot_name
from polygate_celery.telemetry import DeferralEvent, VerdictEvent
from polygate_celery.testing.simulator import SimulatedProvider
from tests import soak
from tests.celery.app import app, ask
from tests.celery.conftest import Worker
from tests.celery.test_outcomes import runs, wait_until
from tests.conftest import Figures, Recorder

# Batch has no floor: while interactive calls wait, batch gets nothing.
CLASSES = {"priorities": {"interactive": {}, "batch": {"default": True}}}
INTERACTIVE_CALLERS = 3  # against one permit: demand above capacity
LOAD_S = float(soak.size(6, 60))
BATCH_TASKS = soak.size(4, 40)


def interactive_load(runtime: Any, until: float, sent: list[int]) -> list[threading.Thread]:
    """Callers of the interactive class, one call after another through the worker's
    gateway (its store and its source) until `until`; each success counted."""

    def caller() -> None:
        while time.monotonic() < until:
            message = [{"role": "user", "content": "now"}]
            runtime.run(runtime.gateway.chat("chat", message, priority="interactive"))
            sent.append(1)

    threads = [threading.Thread(target=caller) for _ in range(INTERACTIVE_CALLERS)]
    for thread in threads:
        thread.start()
    return threads


def indexed(runtime: Any, lot: Any, index: str) -> int:
    """Entries a lot indexes under `index` (a scope's outage, or a starved class's)."""
    return int(runtime.run(lot.client.zcard(lot.scope_index(index))))


@pytest.mark.timeout(900)
def test_a_starved_batch_task_parks_and_runs_once_capacity_frees(
    governed_worker: Worker, broker: str, provider: SimulatedProvider, figures: Figures
) -> None:
    recorder = Recorder()
    sources = {
        "main": {
            "base_url": provider.url,
            "model": "steady",
            "timeout_s": 2,
            "max_concurrency": 1,
        },
        "other": {"base_url": provider.url, "model": "second", "timeout_s": 2},
    }
    before = sum(1 for e in provider.journal if e.model == "steady" and e.outcome == "ok")
    sent: list[int] = []
    with governed_worker(hooks=[recorder], sources=sources, **CLASSES) as runtime:
        load = interactive_load(runtime, time.monotonic() + LOAD_S, sent)
        time.sleep(0.5)  # the interactive callers hold the permit and wait for it
        results = [ask.delay(f"batch {n}") for n in range(BATCH_TASKS)]
        # parked for their class, not as the scope's outage: the interactive calls'
        # successes do not wake them, a batch call's success would (or a probe)
        lot = runtime.state.lot(lot_name(app))
        wait_until(lambda: indexed(runtime, lot, "chat@batch") > 0)
        assert indexed(runtime, lot, "chat") == 0
        for thread in load:
            thread.join()
        load_ended = time.monotonic()
        assert [r.get(timeout=300) for r in results] == ["fine"] * BATCH_TASKS
        all_done_s = time.monotonic() - load_ended
    batch = [e for e in recorder.of(VerdictEvent) if e.priority == "batch"]
    stalled = [e for e in batch if e.verdict == "stalled"]
    # every task parked at least once, within its class's stall window (1 s) of waiting
    assert all(runs(broker, r.id) >= 2 for r in results)
    assert len(stalled) >= BATCH_TASKS
    assert all(e.elapsed_s < 1.0 + 1.0 for e in stalled)
    assert {e.strategy for e in recorder.of(DeferralEvent)} == {"park"}
    assert sum(1 for e in batch if e.verdict == "success") == BATCH_TASKS
    # none lost, none sent twice: the provider answered each batch task's call once
    served = sum(1 for e in provider.journal if e.model == "steady" and e.outcome == "ok")
    assert served - before == len(sent) + BATCH_TASKS
    parkings = len(recorder.of(DeferralEvent))  # (batch tasks alone are deferred here)
    figures(
        f"{BATCH_TASKS} batch tasks (no floor) under {LOAD_S:.0f} s of interactive demand above "
        f"capacity: {len(stalled)} stalls, each within {max(e.elapsed_s for e in stalled):.2f} s "
        f"(window 1 s), {parkings} parkings (each parked task also due back on its own "
        f"within the tests' deferral max_delay_s, 2 s); all succeeded {all_done_s:.1f} s after "
        f"the load "
        f"ended; provider calls: {len(sent)} interactive, {BATCH_TASKS} batch (each once)"
    )
