"""The user's tests: the governed task in virtual time, its verdicts, and a real worker."""

from __future__ import annotations

from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from tasks import CONFIG, app, summarise

from polygate_celery import AllSourcesExhausted, SystemClock
from polygate_celery.testing import ScriptedSource, VirtualClock, steps


def test_a_rate_limit_is_waited_out_in_virtual_time(
    polygate_tasks: Any, polygate_clock: VirtualClock
) -> None:
    vllm = ScriptedSource(
        polygate_clock, [steps.rate_limited(retry_after_s=30), steps.chat("a summary")]
    )
    polygate_tasks(app, CONFIG, {"vllm": vllm}, clock=polygate_clock)
    assert summarise.delay("a long text").get() == "a summary"
    assert polygate_clock.now() >= 30  # waited out the Retry-After, in no real time
    assert vllm.attempts == 2


def test_a_verdict_that_would_defer_is_raised_in_eager_mode(
    polygate_tasks: Any, polygate_clock: VirtualClock
) -> None:
    vllm = ScriptedSource.always(polygate_clock, steps.rate_limited(retry_after_s=600))
    polygate_tasks(app, CONFIG, {"vllm": vllm}, clock=polygate_clock)
    with pytest.raises(AllSourcesExhausted) as raised:
        summarise.delay("a long text").get()
    assert raised.value.reason == "stalled"
    assert any("ran eagerly" in note for note in raised.value.__notes__)


def test_a_real_worker_runs_the_task(polygate_tasks: Any) -> None:
    """A real broker (Redis, `conftest.py`) and a worker in this process: no Docker."""
    vllm = ScriptedSource(SystemClock(), [steps.chat("from a worker")])
    polygate_tasks(app, CONFIG, {"vllm": vllm}, eager=False)
    with start_worker(app, pool="solo", perform_ping_check=False):
        assert summarise.delay("a long text").get(timeout=30) == "from a worker"
