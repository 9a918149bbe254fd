"""A task whose tenant is at its cap parks instead of holding its worker slot (SPEC §8):
its call is held back by its tenant's caps alone, so its stall verdict comes when its
stall window is spent, while the scope serves the other tenants; it is no outage (the
scope's gate stays open, the task waits out its delay); once its tenant has room it
runs again, and its call is sent once."""

from __future__ import annotations

import time

import pytest

from polygate_celery.celery.parking import lot_name
from polygate_celery.core.breaker import Effect
from polygate_celery.core.standing import named_for
from polygate_celery.governance.plan import source_terms
from polygate_celery.store import AdmitRequest, Grant, Settlement
from polygate_celery.telemetry import DeferralEvent, VerdictEvent
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import app, ask_for
from tests.celery.conftest import Worker
from tests.celery.test_outcomes import runs
from tests.conftest import Recorder

CAPPED = {"tenants": {"acme": {"max_concurrency": 1}}}
TASKS = 3


@pytest.mark.timeout(300)
def test_a_task_held_back_by_its_tenants_cap_parks_and_runs_once_it_has_room(
    governed_worker: Worker, broker: str, provider: SimulatedProvider
) -> None:
    recorder = Recorder()
    with governed_worker(hooks=[recorder], **CAPPED) as runtime:
        # one of acme's calls in flight at "main", as another worker would hold it
        terms = source_terms(runtime.config, "main")
        hold = AdmitRequest(
            "chat",
            (terms,),
            named_for("held", "acme"),
            standing=runtime.config.standing(tenant="acme"),
        )
        held = runtime.run(runtime.store.admit(hold))
        assert isinstance(held, Grant)
        before = sum(1 for e in provider.journal if e.outcome == "ok")
        capped = [ask_for.delay("acme") for _ in range(TASKS)]
        others = [ask_for.delay(f"customer-{n}") for n in range(TASKS)]
        assert [r.get(timeout=60) for r in others] == ["fine"] * TASKS  # not held back
        # acme's call stays in flight (its lease renewed) until each of its tasks has
        # parked and run again, however slow the machine
        # (no outage: none of them waits in the scope's outage index meanwhile)
        lot = runtime.state.lot(lot_name(app))
        deadline = time.monotonic() + 90
        while not all(runs(broker, r.id) >= 2 for r in capped):
            assert time.monotonic() < deadline, "acme's tasks did not all park"
            assert runtime.run(runtime.store.renew([(terms, held.permit_id, 10.0)])) == [True]
            assert runtime.run(lot.client.zcard(lot.scope_index("chat"))) == 0
            time.sleep(0.05)
        # no outage: the scope's gate stays open for the other tenants' tasks
        later = [ask_for.delay(f"customer-{n}") for n in range(TASKS, 2 * TASKS)]
        assert [r.get(timeout=60) for r in later] == ["fine"] * TASKS
        assert all(runs(broker, r.id) == 1 for r in [*others, *later])
        settled = Settlement("chat", terms, held.permit_id, held.admitted_at, Effect.SUCCESS)
        runtime.run(runtime.store.settle(settled))
        assert [r.get(timeout=120) for r in capped] == ["fine"] * TASKS
    acme = [e for e in recorder.of(VerdictEvent) if e.tenant == "acme"]
    assert sum(1 for e in acme if e.verdict == "stalled") >= TASKS  # its cap, not the scope
    assert {e.strategy for e in recorder.of(DeferralEvent)} == {"park"}
    assert sum(1 for e in acme if e.verdict == "success") == TASKS
    # none lost, none sent twice: one answer per task
    assert sum(1 for e in provider.journal if e.outcome == "ok") - before == 3 * TASKS
