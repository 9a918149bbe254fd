"""The Celery app of the integration tests: governed tasks against the simulated provider.

Workers in other processes import it too: they read their configuration from
``POLYGATE_CONFIG`` and their broker from ``POLYGATE_TEST_BROKER``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis as sync_redis
from celery import Celery, Task, shared_task, signals
from celery.backends.redis import RedisBackend
from kombu.exceptions import EncodeError, OperationalError

from polygate_celery import AllSourcesExhausted, SourceFatalError, load_config
from polygate_celery.celery import AsyncGovernedCalls, GovernedCalls, configure_worker, governed
from polygate_celery.store.redis import redis_client

app = Celery("polygate_tests")
app.conf.broker_url = os.environ.get("POLYGATE_TEST_BROKER", "redis://127.0.0.1:6379/9")
app.conf.result_backend = app.conf.broker_url
app.conf.task_default_queue = os.environ.get("POLYGATE_TEST_QUEUE", "polygate-tests")
app.conf.broker_connection_retry_on_startup = True
if os.environ.get("POLYGATE_CONFIG"):
    hooks = []
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # the prefork metrics test
        from polygate_celery.metrics import PrometheusHook

        hooks.append(PrometheusHook())
    configure_worker(
        app,
        load_config(),
        hooks=hooks,
        # The whole-worker kill test shortens how long a lost worker's task stays invisible.
        extra_task_s=float(os.environ.get("POLYGATE_TEST_EXTRA_TASK_S", "60")),
        visibility_margin_s=float(os.environ.get("POLYGATE_TEST_VISIBILITY_MARGIN_S", "300")),
    )

HELLO = [{"role": "user", "content": "hello"}]
RECEIVED_URL = os.environ.get("POLYGATE_TEST_RECEIVED")  # where `_received` records ids


@signals.task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    """The worker read the message from the broker (its main process, before any task
    code): recorded, when a test asks for it, in a Redis the test's faults never touch,
    to tell a message the broker transport lost from one that reached the worker."""
    if RECEIVED_URL and request is not None:
        with sync_redis.Redis.from_url(RECEIVED_URL) as client:
            client.sadd("received", request.id)


def note_run(task_id: str) -> None:
    """Count this task's runs, where a test can read them (executions = deferrals + 1),
    and say which process runs it now (for the kill tests)."""
    client = redis_client(app.conf.broker_url)
    import asyncio  # noqa: PLC0415

    async def note() -> None:
        await client.rpush(f"runs:{task_id}", str(os.getpid()))
        await client.aclose()

    asyncio.run(note())


@app.task(bind=True)
@governed("chat")
def ask(self: Any, calls: GovernedCalls, text: str = "hello", fail_fast: bool = False) -> str:
    note_run(self.request.id)
    return calls.chat([{"role": "user", "content": text}], fail_fast=fail_fast).value.text


@app.task
@governed("chat")
def ask_quietly(calls: GovernedCalls, text: str = "hello") -> str:
    """`ask` without the run note: nothing but the governed call touches Redis."""
    return calls.chat([{"role": "user", "content": text}]).value.text


@app.task(bind=True)
@governed()
def ask_in(self: Any, calls: GovernedCalls, scope: str, text: str = "hello") -> str:
    note_run(self.request.id)
    return calls.chat([{"role": "user", "content": text}], scope=scope).value.text


@app.task(bind=True)
@governed("chat", tenant_arg="customer")
def ask_for(self: Any, calls: GovernedCalls, customer: str | None = None) -> str:
    """A call for `customer` (else the message's ``polygate_tenant``), in the class the
    message's ``polygate_priority`` names."""
    note_run(self.request.id)
    return calls.chat(HELLO).value.text


@app.task
@governed("chat", reuse_results=True)
def ask_twice(calls: GovernedCalls, first: str, second: str) -> list[str]:
    """Two paid calls; if the second defers the task, the first is not paid again."""
    one = calls.chat([{"role": "user", "content": first}]).value.text
    two = calls.chat([{"role": "user", "content": second}], scope="second").value.text
    return [one, two, f"reused={calls.reused}"]


@shared_task(bind=True)
@governed("chat")
async def ask_async(self: Any, calls: AsyncGovernedCalls, text: str) -> str:
    result = await calls.chat([{"role": "user", "content": text}])
    return result.value.text


@app.task(bind=True)
@governed("chat")
def record(self: Any, calls: GovernedCalls, text: str) -> str:
    """Records each run's deferral number (a task's runs must read 0, 1, ..., n) and
    when it began (`time.monotonic()`, one clock for every process of the machine)."""
    client = redis_client(app.conf.broker_url)
    import asyncio  # noqa: PLC0415

    deferral = (self.request.headers or {}).get("polygate_deferrals", 0)
    began = time.monotonic()

    async def note() -> None:
        async with client.pipeline(transaction=True) as pipe:
            pipe.rpush(f"deferrals:{self.request.id}", str(deferral))
            pipe.rpush(f"began:{self.request.id}", repr(began))
            await pipe.execute()
        await client.aclose()

    asyncio.run(note())
    return calls.chat([{"role": "user", "content": text}]).value.text


@app.task(bind=True)
@governed("chat")
def defer_then_retry(self: Any, calls: GovernedCalls) -> str:
    """Deferred on its first run, Celery-retried on its second, done on its third."""
    note_run(self.request.id)
    deferral = (self.request.headers or {}).get("polygate_deferrals", 0)
    if deferral == 0:
        from polygate_celery import AllSourcesExhausted  # noqa: PLC0415

        raise AllSourcesExhausted("stalled", "chat", 0.2)
    if self.request.retries == 0:
        raise self.retry(countdown=0.2)
    return calls.chat(HELLO).value.text


@app.task(bind=True)
@governed("chat")
def resets_then_estimates(self: Any, calls: GovernedCalls) -> str:
    """Deferred twice as if waiting for a quota reset, then twice for an estimated
    reopening (as a breaker's cooldown), done on its fifth run."""
    from polygate_celery import AllSourcesExhausted  # noqa: PLC0415

    deferrals = (self.request.headers or {}).get("polygate_deferrals", 0)
    if deferrals < 4:
        raise AllSourcesExhausted("stalled", "chat", 0.3, rate_limited=deferrals < 2)
    return "done"


@app.task
@governed("chat")
def fatal(calls: GovernedCalls) -> None:
    raise SourceFatalError("the request is malformed", "chat")


@app.task
def after(value: Any, tag: str = "after") -> str:
    """A link or chain step: records that it fired."""
    client = redis_client(app.conf.broker_url)
    import asyncio  # noqa: PLC0415

    async def note() -> None:
        await client.rpush(f"fired:{tag}", str(value))
        await client.aclose()

    asyncio.run(note())
    return f"{tag}:{value}"


@app.task
def collect(values: list[Any]) -> list[Any]:
    return sorted(str(v) for v in values)


def _deferrals(task: Any) -> int:
    return int((task.request.headers or {}).get("polygate_deferrals", 0))


def _stall_first_run(task: Any) -> None:
    """Defer the task on its first run, as a stalled scope would."""
    if _deferrals(task) == 0:
        raise AllSourcesExhausted("stalled", "chat", 0.2)


@app.task(bind=True, autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0.2)
@governed("chat")
def defer_then_autoretry(self: Any, calls: GovernedCalls) -> str:
    """Deferred on its first run; its second run fails with a ConnectionError that
    `autoretry_for` retries; the retry succeeds."""
    note_run(self.request.id)
    _stall_first_run(self)
    if self.request.retries == 0:
        raise ConnectionError("the network blinked")
    return calls.chat(HELLO).value.text


@app.task(bind=True, autoretry_for=(AllSourcesExhausted,), max_retries=3, default_retry_delay=0.2)
@governed("chat")
def defer_then_exhaust(self: Any, calls: GovernedCalls) -> str:
    """Like `defer_then_autoretry`, with `autoretry_for` on `AllSourcesExhausted`: the
    second run spends its retry budget, and Celery retries the task."""
    note_run(self.request.id)
    _stall_first_run(self)
    if self.request.retries == 0:
        raise AllSourcesExhausted("retry_exhausted", "chat", 0.0)
    return calls.chat(HELLO).value.text


@app.task(bind=True)
@governed(reuse_results=True)
def ask_kept(self: Any, calls: GovernedCalls, scope: str) -> str:
    """One paid call in `scope`, kept for the task's next run after a deferral."""
    note_run(self.request.id)
    return calls.chat(HELLO, scope=scope).value.text


@app.task(bind=True)
@governed("chat")
def replaced_after_deferral(self: Any, calls: GovernedCalls) -> Any:
    """Deferred on its first run; its second run replaces itself by `ask`."""
    note_run(self.request.id)
    _stall_first_run(self)
    raise self.replace(ask.s("replacement"))


@app.task(bind=True)
@governed("chat")
def witnessed(self: Any, calls: GovernedCalls, scope: str = "killable") -> str:
    """Records each run's start and end (wall time) under ``witness:<task id>``."""
    with sync_redis.Redis.from_url(app.conf.broker_url) as client:
        client.rpush(f"witness:{self.request.id}", f"start {time.time()}")
        answer = calls.chat(HELLO, scope=scope).value.text
        client.rpush(f"witness:{self.request.id}", f"end {time.time()}")
    return answer


@app.task(bind=True)
@governed("chat")
def dies_after_storing(self: Any, calls: GovernedCalls, text: str) -> str:
    """Fails; its first run's pool process is killed right after Celery stored the
    failure (`_kill_once_stored`), before the run is marked finished."""
    note_run(self.request.id)
    raise ValueError(f"{text}: the body's own error")


@signals.task_failure.connect
def _kill_once_stored(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    """``task_failure`` comes after Celery stored the failure (and counted any chord
    part), before ``task_postrun``: the window in which a lost pool process leaves a
    stored run unfinished. Celery requeues the message (``task_reject_on_worker_lost``):
    it skips a redelivery only when SUCCESS was stored, and only from the main process
    that saw the loss."""
    if getattr(sender, "name", None) != dies_after_storing.name:
        return
    with sync_redis.Redis.from_url(app.conf.broker_url) as client:
        if client.set(f"killed:{task_id}", 1, nx=True, ex=600):
            os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True)
@governed("chat")
def lost_before_counted(self: Any, calls: GovernedCalls, text: str, fail: bool = False) -> str:
    """A chord member whose first run's pool process is killed after Celery stored its
    outcome and before it was counted toward the chord (`_kill_before_counting`)."""
    note_run(self.request.id)
    answer = calls.chat([{"role": "user", "content": text}]).value.text
    if fail:
        raise ValueError(f"{text}: the member's own error")
    return answer


@app.task(bind=True)
def plain_lost_before_counted(self: Any, text: str) -> str:
    """An ungoverned chord member lost in the same window (`_kill_before_counting`)."""
    note_run(self.request.id)
    return f"plain {text}"


def _kill_before_counting(count: Any) -> Any:
    """Wrap the Redis result backend's chord count: the first count of a
    `lost_before_counted` run kills its process instead (once per task id, noted on the
    broker), the window between storing an outcome and counting it."""

    def counted(backend: Any, request: Any, state: str, result: Any, **kwargs: Any) -> Any:
        if getattr(request, "task", None) in (
            lost_before_counted.name,
            plain_lost_before_counted.name,
        ):
            with sync_redis.Redis.from_url(app.conf.broker_url) as client:
                if client.set(f"killed:{request.id}", 1, nx=True, ex=600):
                    os.kill(os.getpid(), signal.SIGKILL)
        return count(backend, request, state, result, **kwargs)

    return counted


RedisBackend.on_chord_part_return = _kill_before_counting(RedisBackend.on_chord_part_return)


@app.task(bind=True)
def collect_lost_sending(self: Any, values: list[Any]) -> list[Any]:
    """A chord body whose first sender is killed after it claimed the dispatch, before
    it sent the body (`_kill_while_sending`)."""
    note_run(self.request.id)
    return sorted(str(v) for v in values)


def _kill_while_sending(claim_for_sending: Any) -> Any:
    """Wrap the Redis result backend's step between claiming a complete chord's
    dispatch and sending its body: for a `collect_lost_sending` body, the first process
    there is killed (once per body id, noted on the broker)."""

    def claimed(backend: Any, initial_expires: int, callback: Any) -> Any:
        body_id = callback.options.get("task_id")
        if callback.task == collect_lost_sending.name and body_id:
            with sync_redis.Redis.from_url(app.conf.broker_url) as client:
                if client.set(f"killed:{body_id}", 1, nx=True, ex=600):
                    os.kill(os.getpid(), signal.SIGKILL)
        return claim_for_sending(backend, initial_expires, callback)

    return claimed


RedisBackend._chord_publish_claim_expires = _kill_while_sending(
    RedisBackend._chord_publish_claim_expires
)


class RetryPublishFails(Task):  # type: ignore[misc]
    """A task whose first retry message does not reach the broker: its publish raises
    `fault`, as when the broker goes away mid-retry (later publishes go through).
    `acks_late` as `configure_worker` sets it (in-process workers bind tasks before)."""

    acks_late = True

    fault: type[Exception] = OperationalError
    every_time = False

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        retry_of = options.get("task_id") if options.get("retries") else None
        if retry_of and (
            self.every_time
            or sync_redis.Redis.from_url(app.conf.broker_url).set(
                f"retry-fault:{retry_of}", 1, nx=True
            )
        ):
            raise self.fault("the retry message did not reach the broker")
        return super().apply_async(args, kwargs, **options)


@app.task(bind=True, base=RetryPublishFails, max_retries=3, default_retry_delay=0.1)
@governed("chat")
def retry_unpublished(self: Any, calls: GovernedCalls) -> str:
    """`self.retry()` on the first run, whose retry message does not reach the broker."""
    note_run(self.request.id)
    if self.request.retries == 0:
        raise self.retry(exc=ConnectionError("the network blinked"))
    return calls.chat(HELLO).value.text


@app.task(
    bind=True,
    base=RetryPublishFails,
    autoretry_for=(ConnectionError,),
    max_retries=3,
    default_retry_delay=0.1,
)
@governed("chat")
def autoretry_unpublished(self: Any, calls: GovernedCalls) -> str:
    """Like `retry_unpublished`, retried by `autoretry_for` after the body has ended."""
    note_run(self.request.id)
    if self.request.retries == 0:
        raise ConnectionError("the network blinked")
    return calls.chat(HELLO).value.text


class RetryCannotEncode(RetryPublishFails):  # type: ignore[misc]
    fault = EncodeError


@app.task(bind=True, base=RetryCannotEncode, max_retries=3, default_retry_delay=0.1)
@governed("chat")
def retry_unencodable(self: Any, calls: GovernedCalls) -> str:
    """`self.retry()` whose message cannot be encoded: it would fail on every redelivery."""
    note_run(self.request.id)
    raise self.retry(exc=ConnectionError("the network blinked"))


class RetryNeverPublished(RetryPublishFails):  # type: ignore[misc]
    every_time = True


@app.task(bind=True, base=RetryNeverPublished, max_retries=3, default_retry_delay=0.1)
@governed("chat")
def retry_never_published(self: Any, calls: GovernedCalls) -> str:
    """`self.retry()` whose message the broker never takes."""
    note_run(self.request.id)
    raise self.retry(exc=ConnectionError("the network blinked"))


@app.task(bind=True)
@governed("chat")
def timed(self: Any, calls: GovernedCalls, text: str) -> str:
    """Records each run as ``deferral number, began, ended`` (`time.monotonic()`, one clock
    for every process of the machine): how long the run held its worker slot."""
    deferral = (self.request.headers or {}).get("polygate_deferrals", 0)
    began = time.monotonic()
    try:
        return calls.chat([{"role": "user", "content": text}]).value.text
    finally:
        with sync_redis.Redis.from_url(app.conf.broker_url) as client:
            client.rpush(f"timed:{self.request.id}", f"{deferral} {began!r} {time.monotonic()!r}")
