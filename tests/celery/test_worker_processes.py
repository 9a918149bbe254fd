"""Real `celery worker` processes: the prefork pool, time limits, revokes and SIGKILLs."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from celery import chord
from celery.exceptions import ChordError, SoftTimeLimitExceeded, TaskRevokedError

from polygate_celery.core.terms import SourceTerms
from polygate_celery.store.redis import RedisStore
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import (
    app,
    ask,
    ask_in,
    collect,
    collect_lost_sending,
    dies_after_storing,
    lost_before_counted,
    plain_lost_before_counted,
)
from tests.celery.conftest import config_data
from tests.celery.workers import celery_worker
from tests.conftest import Figures
from tests.soak import size

LEASE_S = 2.0


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    prefix = f"procs-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)


@pytest.fixture
def worker_config(provider: SimulatedProvider, redis_url: str, prefix: str) -> dict[str, Any]:
    data = config_data(
        provider,
        redis_url,
        prefix,
        extra_sources={"slow": "slow", "killable": "killable"},
    )
    data["store"]["lease_s"] = LEASE_S
    return data


@pytest.fixture
def client_app(broker: str) -> Any:
    app.conf.update(broker_url=broker, result_backend=broker, task_default_queue="polygate-tests")
    return app


def permits_in_use(redis_url: str, prefix: str, source: str) -> int:
    async def read() -> int:
        store = RedisStore.from_url(redis_url, prefix=prefix)
        try:
            return (await store.snapshot(SourceTerms(source, 1))).permits_in_use
        finally:
            await store.aclose()

    return asyncio.run(read())


def lease_end(redis_url: str, prefix: str, source: str) -> tuple[float, float]:
    """Redis ``TIME`` now, and the latest lease expiry held at `source`."""
    client = sync_redis.Redis.from_url(redis_url)
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.zrange(f"{{{prefix}}}:v1:src:{source}:permits", -1, -1, withscores=True)
        (seconds, micros), held = pipe.execute()
    return seconds + micros / 1e6, held[0][1]


def running_pid(broker: str, task_id: str, runs: int = 1, within_s: float = 20) -> int:
    client = sync_redis.Redis.from_url(broker)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        pids = client.lrange(f"runs:{task_id}", 0, -1)
        if len(pids) >= runs:
            return int(pids[runs - 1])
        time.sleep(0.02)
    raise AssertionError(f"task {task_id} did not start")


def wait_until(condition: Any, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


def test_the_prefork_pool_runs_governed_tasks(
    client_app: Any, worker_config: dict[str, Any], broker: str, tmp_path: Path
) -> None:
    with celery_worker(worker_config, broker, tmp_path, pool="prefork", concurrency=2):
        results = [ask.delay(f"n{i}") for i in range(8)]
        assert [r.get(timeout=60) for r in results] == ["fine"] * 8


@pytest.mark.parametrize("stop", ["soft_time_limit", "revoke"])
def test_an_interrupted_call_releases_its_permit_and_the_worker_goes_on(
    client_app: Any,
    worker_config: dict[str, Any],
    broker: str,
    redis_url: str,
    prefix: str,
    tmp_path: Path,
    stop: str,
) -> None:
    with celery_worker(worker_config, broker, tmp_path, pool="prefork", concurrency=1):
        options = {"soft_time_limit": 1.5} if stop == "soft_time_limit" else {}
        result = ask_in.apply_async(("slow", "x"), **options)
        running_pid(broker, result.id)
        if stop == "revoke":
            time.sleep(0.5)
            app.control.revoke(result.id, terminate=True, signal="SIGUSR1")
        # ``revoke(terminate=True, signal="SIGUSR1")`` raises SoftTimeLimitExceeded in the
        # pool process while the main process stores REVOKED: whichever state reaches the
        # backend first is the outcome (the child's, when the main process is slow to be
        # scheduled). The task's own soft limit is minutes away, so within 30 s either
        # one can only come from the revoke.
        expected: Any = (
            SoftTimeLimitExceeded
            if stop == "soft_time_limit"
            else (TaskRevokedError, SoftTimeLimitExceeded)
        )
        with pytest.raises(expected):
            result.get(timeout=30)
        assert permits_in_use(redis_url, prefix, "slow") == 0
        assert ask.delay("next").get(timeout=30) == "fine"  # same process, same loop


def test_a_killed_pool_process_mid_call_is_redelivered_and_its_permit_returns(
    client_app: Any,
    worker_config: dict[str, Any],
    broker: str,
    redis_url: str,
    prefix: str,
    provider: SimulatedProvider,
    tmp_path: Path,
    figures: Figures,
) -> None:
    trials = size(ci=3, soak=20)
    gaps = []
    with celery_worker(worker_config, broker, tmp_path, pool="prefork", concurrency=2):
        assert ask.delay("warm up").get(timeout=60) == "fine"
        for _ in range(trials):
            result = ask_in.delay("killable", "x")
            pid = running_pid(broker, result.id)
            wait_until(lambda: provider.in_flight("killable") == 1)  # the permit is held
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            # The dead run's lease, on Redis's clock, outlives the kill by lease_s at most.
            killed_on_redis, expiry = lease_end(redis_url, prefix, "killable")
            assert expiry <= killed_on_redis + LEASE_S
            running_pid(broker, result.id, runs=2, within_s=30)  # redelivered and started
            redelivered = time.monotonic() - killed_at
            wait_until(lambda: provider.in_flight("killable") == 1)  # the permit came back
            regranted = time.monotonic() - killed_at
            gaps.append((redelivered, regranted))
            assert result.get(timeout=30) == "survived"
            assert sync_redis.Redis.from_url(broker).llen(f"runs:{result.id}") <= 2  # no deferral
    redelivery = [g[0] for g in gaps]
    figures(
        f"{trials} kills: redelivered after {min(redelivery):.2f}-{max(redelivery):.2f} s; "
        f"permit regranted {min(g[1] for g in gaps):.2f}-{max(g[1] for g in gaps):.2f} s"
    )


def test_a_run_killed_after_its_result_was_stored_is_not_run_again(
    client_app: Any,
    worker_config: dict[str, Any],
    broker: str,
    redis_url: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """The pool process dies between Celery storing the outcome (and counting the chord
    part) and the run being marked finished: the copy Celery requeues finds the outcome
    in the result backend and is dropped, instead of storing (and counting) a second."""
    with celery_worker(worker_config, broker, tmp_path, pool="prefork", concurrency=2):
        result = dies_after_storing.delay("once")
        store = sync_redis.Redis.from_url(redis_url)
        wait_until(  # the copy came back and was dropped: the run is marked finished
            lambda: (
                [
                    store.get(key)
                    for key in store.scan_iter(match=f"{{{prefix}}}*:done:{result.id}:*")
                ]
                == [b"1"]
            ),
            within_s=60,
        )
        with pytest.raises(ValueError, match="once: the body's own error"):
            result.get(timeout=30)
        assert sync_redis.Redis.from_url(broker).get(f"killed:{result.id}") == b"1"
        assert sync_redis.Redis.from_url(broker).llen(f"runs:{result.id}") == 1


@pytest.mark.parametrize(
    ("member_task", "answers"),
    [("governed", ["fine", "fine"]), ("plain", ["fine", "plain member"])],
)
def test_a_chord_member_lost_after_its_success_was_stored_still_counts(
    client_app: Any,
    worker_config: dict[str, Any],
    broker: str,
    tmp_path: Path,
    member_task: str,
    answers: list[str],
) -> None:
    """The pool process dies after Celery stored the member's SUCCESS and before it
    counted the member toward the chord. Celery's main process acknowledges such a
    message without counting it; the body runs all the same, and the member once. A
    plain (ungoverned) member beside a governed one is lost the same way."""
    task = lost_before_counted if member_task == "governed" else plain_lost_before_counted
    with celery_worker(worker_config, broker, tmp_path, pool="prefork", concurrency=2):
        member = task.s("member")
        member.freeze()
        body = chord([member, ask.s("other")])(collect.s())
        assert body.get(timeout=60) == answers
        client = sync_redis.Redis.from_url(broker)
        assert client.get(f"killed:{member.id}") == b"1"
        assert client.llen(f"runs:{member.id}") == 1


def test_a_chord_member_lost_after_its_failure_was_stored_still_counts(
    client_app: Any, worker_config: dict[str, Any], broker: str, tmp_path: Path
) -> None:
    """The same window after a stored FAILURE: Celery requeues the message, and the
    copy, dropped because the outcome is stored, counts it: the chord fails with the
    member's error instead of waiting forever, and the member ran once."""
    with celery_worker(worker_config, broker, tmp_path, pool="prefork", concurrency=2):
        member = lost_before_counted.s("member", fail=True)
        member.freeze()
        body = chord([member, ask.s("other")])(collect.s())
        own = app.AsyncResult(body.id)  # the body's own outcome, not its members'
        with pytest.raises(ChordError, match="member: the member's own error"):
            own.get(timeout=90)
        client = sync_redis.Redis.from_url(broker)
        assert client.get(f"killed:{member.id}") == b"1"
        assert client.llen(f"runs:{member.id}") == 1


def test_a_chord_whose_sender_was_lost_while_sending_its_body_still_runs_it(
    client_app: Any, worker_config: dict[str, Any], broker: str, tmp_path: Path
) -> None:
    """The pool process that counted the last member, and so claimed the chord's
    dispatch, dies before it sent the body. The claim outlives it; once the claim ran
    out the part is counted again, and that count sends the body."""
    with celery_worker(worker_config, broker, tmp_path, pool="prefork", concurrency=2):
        first, second = ask.s("one"), ask.s("two")
        result = chord([first, second])(collect_lost_sending.s())
        assert result.get(timeout=90) == ["fine", "fine"]
        client = sync_redis.Redis.from_url(broker)
        assert client.get(f"killed:{result.id}") == b"1"
        assert client.llen(f"runs:{result.id}") == 1


def test_a_killed_worker_process_loses_no_task_and_runs_it_at_most_twice(
    client_app: Any,
    worker_config: dict[str, Any],
    broker: str,
    provider: SimulatedProvider,
    tmp_path: Path,
    figures: Figures,
) -> None:
    """SIGKILL of the main worker process (its pool with it) mid-call: the broker hands
    the unacknowledged task to the next worker once its visibility timeout passes
    (here 34 s: every scope's max_call_s 2 s, a 1 s margin, the 30 s hard-limit floor).
    One kill in CI, 20 under ``make soak``."""
    trials = size(ci=1, soak=20)
    for scope in worker_config["scopes"].values():
        scope["max_call_s"] = 2
    quick = {"POLYGATE_TEST_EXTRA_TASK_S": "1", "POLYGATE_TEST_VISIBILITY_MARGIN_S": "1"}
    back_after = []
    for _ in range(trials):
        with celery_worker(worker_config, broker, tmp_path, concurrency=1, settings=quick) as w:
            result = ask_in.delay("killable", "x")
            running_pid(broker, result.id)
            wait_until(lambda: provider.in_flight("killable") == 1)
            killed_at = time.monotonic()
            os.killpg(w.pid, signal.SIGKILL)
            w.wait(10)
        with celery_worker(worker_config, broker, tmp_path, concurrency=1, settings=quick):
            assert result.get(timeout=120) == "survived"
            back_after.append(time.monotonic() - killed_at)
        runs = sync_redis.Redis.from_url(broker).llen(f"runs:{result.id}")
        assert runs <= 2  # no deferral here: at most deferrals + 2 runs
    figures(
        f"{trials} whole-worker kills: every task done, at most 2 runs each; back after "
        f"{min(back_after):.1f}-{max(back_after):.1f} s (visibility timeout + restore)"
    )
