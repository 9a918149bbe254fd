"""`governed_tasks`: a Celery app's governed tasks in this process, undone without a trace."""

from __future__ import annotations

import threading

import pytest
from celery import Celery

from polygate_celery import AllSourcesExhausted, parse_config
from polygate_celery.celery import GovernedCalls, governed
from polygate_celery.celery.runtime import registered_config
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from polygate_celery.testing.celery import governed_tasks

CONFIG = parse_config(
    {
        "sources": {"vllm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
        "scopes": {"summarise": {"kind": "chat", "sources": ["vllm"], "stall_window_s": 60}},
    }
)
app = Celery("kit", set_as_current=False)


@app.task(name="kit.summarise", shared=False)
@governed("summarise")
def summarise(calls: GovernedCalls, text: str) -> str:
    return str(calls.chat([{"role": "user", "content": text}]).value.text)


def test_a_task_runs_against_a_script_in_virtual_time_and_leaves_nothing_behind() -> None:
    threads = threading.active_count()
    clock = VirtualClock()
    script = [steps.rate_limited(retry_after_s=30), steps.chat("done")]
    with governed_tasks(app, CONFIG, {"vllm": ScriptedSource(clock, script)}, clock=clock):
        assert app.conf.task_always_eager
        assert summarise.delay("x").get() == "done"
        assert clock.now() >= 30
    assert threading.active_count() == threads  # the runtime's loop thread is gone
    assert not app.conf.task_always_eager
    assert registered_config(app) is None


def test_eager_mode_raises_the_verdict_that_would_defer() -> None:
    clock = VirtualClock()
    source = ScriptedSource.always(clock, steps.rate_limited(retry_after_s=600))
    with (
        governed_tasks(app, CONFIG, {"vllm": source}, clock=clock),
        pytest.raises(AllSourcesExhausted) as raised,
    ):
        summarise.delay("x").get()
    assert raised.value.reason == "stalled"
    assert 60 <= clock.now() <= 61  # the stall window (and its last poll), in virtual time
