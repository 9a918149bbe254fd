"""The outcome table (SPEC §6), one test per row, with a real broker and a real worker."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis as sync_redis
from celery import chain, chord

from polygate_celery import AllSourcesExhausted, DeferralBudgetExceeded, SourceFatalError
from polygate_celery.celery import DEFERRED
from polygate_celery.celery.parking import lot_name
from tests.celery.app import after, ask, ask_async, ask_twice, collect, fatal
from tests.celery.conftest import Worker


def runs(broker: str, task_id: str) -> int:
    return int(sync_redis.Redis.from_url(broker).llen(f"runs:{task_id}"))


def wait_for_state(result: Any, state: str, within_s: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if result.state == state:
            return result.info or {}
        time.sleep(0.05)
    raise AssertionError(f"{result.id} never reached {state} (is {result.state})")


def wait_until(condition: Any, within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


DEFER_PAUSE_S = 5.0
"""A pause that makes the next task defer: still on when a busy machine's worker gets the
task (a 1.5 s pause was over first, beside two CPU-bound processes)."""


def pause(runtime: Any, source: str, seconds: float) -> None:
    runtime.run(runtime.store.pause_source(source, seconds))


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_success(governed_worker: Worker, broker: str, pool: str) -> None:
    with governed_worker(pool=pool, concurrency=1 if pool == "solo" else 4):
        result = ask.delay("hi")
        assert result.get(timeout=20) == "fine"
        assert runs(broker, result.id) == 1


@pytest.mark.parametrize("strategy", ["park", "countdown"])
def test_a_stalled_scope_defers_the_task_which_then_succeeds(
    governed_worker: Worker, broker: str, strategy: str
) -> None:
    with governed_worker(deferral={"strategy": strategy}) as runtime:
        pause(runtime, "main", 3.0)  # longer than the 1 s stall window
        result = ask.delay("later")
        meta = wait_for_state(result, DEFERRED)
        assert (meta["reason"], meta["strategy"]) == ("stalled", strategy)
        assert meta["deferrals"] >= 1
        lot = runtime.keys.parked(lot_name(ask.app))
        if strategy == "countdown":  # it waits in the broker, not in the lot
            assert runtime.blocking_redis.zcard(lot) == 0
        else:  # parked until the pause ends (its entry is written just after the state)
            wait_until(lambda: runtime.blocking_redis.zcard(lot) == 1)
        assert result.get(timeout=30) == "fine"
    executions = runs(broker, result.id)
    assert executions >= 2  # = deferrals + 1, with the same task id throughout


def test_fail_fast_defers(governed_worker: Worker) -> None:
    with governed_worker() as runtime:
        pause(runtime, "main", DEFER_PAUSE_S)
        result = ask.delay("now or later", fail_fast=True)
        assert wait_for_state(result, DEFERRED)["reason"] == "fail_fast"
        assert result.get(timeout=30) == "fine"


def test_the_deadline_defers(governed_worker: Worker) -> None:
    with governed_worker(scope={"max_call_s": 0.5, "stall_window_s": 5}) as runtime:
        pause(runtime, "main", DEFER_PAUSE_S)
        result = ask.delay("slowly")
        assert wait_for_state(result, DEFERRED)["reason"] == "deadline"
        assert result.get(timeout=30) == "fine"


def test_retry_exhausted_fails_the_task_with_its_verdict(governed_worker: Worker) -> None:
    with governed_worker(model="broken", scope={"outage_is_waiting": False}):
        result = ask.delay("doomed")
        with pytest.raises(AllSourcesExhausted) as caught:
            result.get(timeout=20)
    assert caught.value.reason == "retry_exhausted"
    assert (caught.value.scope, caught.value.attempts) == ("chat", 2)
    assert result.state == "FAILURE"


def test_a_fatal_error_fails_the_task_at_once(governed_worker: Worker) -> None:
    with governed_worker():
        result = fatal.delay()
        with pytest.raises(SourceFatalError, match="malformed"):
            result.get(timeout=20)


def test_a_spent_deferral_budget_fails_the_task(governed_worker: Worker) -> None:
    with governed_worker(deferral={"max_deferrals": 1}) as runtime:
        pause(runtime, "main", 60)
        result = ask.delay("never")
        with pytest.raises(DeferralBudgetExceeded) as caught:
            result.get(timeout=30)
    assert (caught.value.reason, caught.value.deferrals) == ("stalled", 1)


def test_a_deferral_budget_spent_by_age_fails_the_task(governed_worker: Worker) -> None:
    with governed_worker(deferral={"max_defer_age_s": 3}) as runtime:
        pause(runtime, "main", 60)
        result = ask.delay("never")
        with pytest.raises(DeferralBudgetExceeded) as caught:
            result.get(timeout=60)
    assert caught.value.reason == "stalled"
    assert caught.value.age_s > 3  # ended by its age, well before the 25 deferrals allowed
    assert 1 <= caught.value.deferrals < 25


def test_an_unreachable_store_defers_the_task(governed_worker: Worker, broker: str) -> None:
    from tests.redis_server import RedisServer  # noqa: PLC0415

    with (
        RedisServer() as store,
        governed_worker(store={"redis_url": store.url, "lease_s": 10, "socket_timeout_s": 0.5}),
    ):
        store.pause()  # the governance store stops answering; the broker does not
        result = ask.delay("held")
        assert wait_for_state(result, DEFERRED)["reason"] == "backend_error"
        store.resume()
        assert result.get(timeout=30) == "fine"


def test_links_and_chain_steps_fire_once_after_the_final_success(
    governed_worker: Worker, broker: str
) -> None:
    client = sync_redis.Redis.from_url(broker)
    with governed_worker() as runtime:
        pause(runtime, "main", 2.0)
        linked = ask.apply_async(("a",), link=after.s(tag="link"))
        chained = chain(ask.s("b"), after.s(tag="chain")).apply_async()
        assert chained.get(timeout=30) == "chain:fine"
        assert linked.get(timeout=30) == "fine"
        time.sleep(0.5)
    assert client.lrange("fired:link", 0, -1) == [b"fine"]
    assert client.lrange("fired:chain", 0, -1) == [b"fine"]
    assert runs(broker, linked.id) >= 2


def test_a_chord_waits_for_its_deferred_member(governed_worker: Worker) -> None:
    with governed_worker() as runtime:
        pause(runtime, "main", 2.0)
        result = chord([ask.s("x"), ask.s("y")], collect.s()).apply_async()
        assert result.get(timeout=30) == ["fine", "fine"]


def test_paid_results_are_reused_after_a_deferral(governed_worker: Worker, provider: Any) -> None:
    with governed_worker() as runtime:
        # The second call stalls (its 1 s window) and defers the task until the pause
        # ends; the first is paid once. 6 s: room for a busy machine to reach the second
        # call while its source is still paused.
        pause(runtime, "other", 6.0)
        provider.reset_journal()
        result = ask_twice.delay("first prompt", "second prompt")
        assert result.get(timeout=60) == ["fine", "second answer", "reused=1"]
    to_first = [e for e in provider.journal if e.model == "up"]
    assert len(to_first) == 1


def test_an_async_body_runs_on_the_worker_loop(governed_worker: Worker) -> None:
    with governed_worker():
        assert ask_async.delay("async").get(timeout=20) == "fine"
