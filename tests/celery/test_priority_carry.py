"""A deferred task keeps its priority class and tenant: its message's headers and arguments
are republished as they were, whether it waits in the parking lot or in the broker."""

from __future__ import annotations

import pytest

from polygate_celery.celery import DEFERRED
from polygate_celery.celery.priority import PRIORITY_HEADER, TENANT_HEADER
from polygate_celery.telemetry import VerdictEvent
from tests.celery.app import ask_for
from tests.celery.conftest import Worker
from tests.celery.test_outcomes import pause, runs, wait_for_state
from tests.conftest import Recorder

CLASSES = {"priorities": {"interactive": {}, "batch": {"default": True}}}


@pytest.mark.parametrize("strategy", ["park", "countdown"])
def test_a_deferred_task_runs_again_in_its_class_and_for_its_tenant(
    governed_worker: Worker, broker: str, strategy: str
) -> None:
    recorder = Recorder()
    with governed_worker(deferral={"strategy": strategy}, hooks=[recorder], **CLASSES) as runtime:
        pause(runtime, "main", 3.0)  # longer than the 1 s stall window: both defer
        interactive = {PRIORITY_HEADER: "interactive"}
        by_header = ask_for.apply_async(headers={**interactive, TENANT_HEADER: "acme"})
        by_argument = ask_for.apply_async(("customer-7",), headers=interactive)
        for result in (by_header, by_argument):
            assert wait_for_state(result, DEFERRED)["strategy"] == strategy
        assert by_header.get(timeout=30) == by_argument.get(timeout=30) == "fine"
    for result in (by_header, by_argument):
        assert runs(broker, result.id) >= 2  # deferred, then run again from its new message
    for tenant in ("acme", "customer-7"):
        verdicts = [e for e in recorder.of(VerdictEvent) if e.tenant == tenant]
        assert verdicts[0].verdict == "stalled"
        assert verdicts[-1].verdict == "success"  # a later run's call: the class held
        assert {e.priority for e in verdicts} == {"interactive"}
    assert {e.tenant for e in recorder.of(VerdictEvent)} == {"acme", "customer-7"}
