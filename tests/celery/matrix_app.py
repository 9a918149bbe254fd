"""The Celery app of the feature x fault matrix (tests/celery/test_matrix.py).

Imported by the pytest process (the client side: task names and signatures) and
by every ``celery -A tests.celery.matrix_app worker`` it starts. A worker reads:

- ``MATRIX_BROKER``: broker and result backend URL; ``MATRIX_QUEUE``: its queue;
- ``MATRIX_CONFIG``: the polygate configuration file (``configure_worker`` is
  called only when it is set, so the client side configures nothing);
- ``MATRIX_EXTRA_TASK_S`` / ``MATRIX_VISIBILITY_MARGIN_S``: `configure_worker`'s
  time-limit slack and visibility margin (a short visibility timeout);
- ``MATRIX_SENT_EVENT=1``: ``task_send_sent_event`` on;
- ``MATRIX_WITNESS`` (a Redis URL that no fault touches), ``MATRIX_WITNESS_KEY``
  and ``MATRIX_WORKER_TAG``: where every body run is recorded.

Every governed body defers on its first run (no ``polygate_deferrals`` header)
and makes one real governed call on a later run. The answer is
``"<sub>:<reply>:<prompt tokens>"``: the prompt is ``4 * n`` characters, so the
simulated provider's usage says which submission's call it was, and a result
kept for another submission (``reuse_results``) would be detected.

The witness is one JSON entry per step of a run: ``start``, ``call`` (the
governed call begins), ``end`` (the body returned) or ``left`` (it raised, on
purpose), each with the run id, submission, wall time, pid, thread id and worker;
and ``received`` (the worker read a message of that task id from the broker).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from typing import Any

import redis
from celery import Celery, Task, current_task, shared_task
from celery.signals import task_postrun, task_received

from polygate_celery import AllSourcesExhausted, load_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed

BROKER = os.environ.get("MATRIX_BROKER", "redis://127.0.0.1:6379/15")
QUEUE = os.environ.get("MATRIX_QUEUE", "polygate-matrix")
WITNESS_URL = os.environ.get("MATRIX_WITNESS", "")
WITNESS_KEY = os.environ.get("MATRIX_WITNESS_KEY", "matrix:runs")
WORKER_TAG = os.environ.get("MATRIX_WORKER_TAG", "client")
FIRST_DEFERRAL_S = 0.5  # the stalled verdict's retry_after_s on a body's first run
RETRY_DELAY_S = 0.2

app = Celery("polygate_matrix")
app.conf.broker_url = BROKER
app.conf.result_backend = BROKER
app.conf.task_default_queue = QUEUE
app.conf.broker_connection_retry_on_startup = True
app.conf.task_send_sent_event = os.environ.get("MATRIX_SENT_EVENT") == "1"
# kombu looks for unacknowledged messages past their visibility timeout every 10 s by
# default; every second here, so a cold-stopped worker's task is back soon after it.
app.conf.broker_transport_options = {"unacked_restore_interval": 1}
if os.environ.get("MATRIX_CONFIG"):
    configure_worker(
        app,
        load_config(os.environ["MATRIX_CONFIG"]),
        extra_task_s=float(os.environ.get("MATRIX_EXTRA_TASK_S", "60")),
        visibility_margin_s=float(os.environ.get("MATRIX_VISIBILITY_MARGIN_S", "300")),
    )

_clients: dict[int, redis.Redis] = {}
_lock = threading.Lock()


def _witness() -> redis.Redis | None:
    if not WITNESS_URL:
        return None
    with _lock:
        client = _clients.get(os.getpid())
        if client is None:  # a client per process: a forked child makes its own
            client = redis.Redis.from_url(WITNESS_URL, socket_timeout=10)
            _clients.clear()
            _clients[os.getpid()] = client
        return client


class Run:
    """One run of a task body, as the witness records it."""

    def __init__(self, task: Task[Any, Any], sub: str, role: str) -> None:
        self.id = uuid.uuid4().hex
        self.task = task
        self.sub = sub
        self.role = role
        headers = task.request.headers or {}
        self.deferrals = int(headers.get("polygate_deferrals") or 0)
        self.note("start")
        _running.run = self

    def note(self, event: str, **extra: Any) -> None:
        client = _witness()
        if client is None:
            return
        request = self.task.request
        headers = request.headers or {}
        entry = {
            "ev": event,
            "run": self.id,
            "sub": self.sub,
            "role": self.role,
            "task": request.id,
            "name": self.task.name,
            "deferrals": self.deferrals,
            "retries": request.retries or 0,
            "submission": headers.get("polygate_submission"),
            "redelivered": bool((request.delivery_info or {}).get("redelivered")),
            "worker": WORKER_TAG,
            "pid": os.getpid(),
            "tid": threading.get_ident(),
            "t": time.time(),
            **extra,
        }
        client.rpush(WITNESS_KEY, json.dumps(entry))

    def left(self, reason: str) -> None:
        self.note("left", reason=reason)

    def end(self, value: Any) -> Any:
        self.note("end", value=value)
        return value


_running = threading.local()  # the body run of this thread's current task


@task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    """The worker read the message from the broker (its main process, before any task
    code): the witness's "received", which tells a message the broker transport lost
    from one that reached the worker."""
    client = _witness()
    if client is None or request is None:
        return
    entry = {"ev": "received", "task": request.id, "worker": WORKER_TAG, "t": time.time()}
    client.rpush(WITNESS_KEY, json.dumps(entry))


@task_postrun.connect
def _outcome_recorded(task_id: str | None = None, **_: Any) -> None:
    """Celery stored the run's outcome and polygate_celery finished the run (its handler,
    connected first, runs first): the witness's "post"."""
    run: Run | None = getattr(_running, "run", None)
    _running.run = None
    if run is not None and run.task.request.id == task_id:
        run.note("post")


def _current() -> Task[Any, Any]:
    task = current_task
    if task is None:  # pragma: no cover - the governed decorator checks this first
        raise RuntimeError("no current task")
    return task._get_current_object()  # type: ignore[no-any-return,attr-defined]


def _start(task: Task[Any, Any], sub: str, role: str = "governed") -> Run:
    """Record the run's start; defer the task on its first run."""
    run = Run(task, sub, role)
    if run.deferrals == 0:
        run.left("defer")
        raise AllSourcesExhausted("stalled", "chat", FIRST_DEFERRAL_S)
    return run


def _answer(run: Run, calls: GovernedCalls, sub: str, n: int) -> str:
    run.note("call")
    result = calls.chat([{"role": "user", "content": "p" * (4 * n)}])
    return str(run.end(f"{sub}:{result.value.text}:{result.prompt_tokens}"))


def expected_answer(sub: str, n: int, reply: str) -> str:
    return f"{sub}:{reply}:{n}"


@app.task(name="matrix.plain")
@governed("chat")
def plain(calls: GovernedCalls, sub: str, n: int) -> str:
    return _answer(_start(_current(), sub), calls, sub, n)


@app.task(name="matrix.bound", bind=True)
@governed("chat")
def bound(self: Task[Any, Any], calls: GovernedCalls, sub: str, n: int) -> str:
    return _answer(_start(self, sub), calls, sub, n)


@shared_task(name="matrix.shared")
@governed("chat")
def shared(calls: GovernedCalls, sub: str, n: int) -> str:
    return _answer(_start(_current(), sub), calls, sub, n)


@app.task(
    name="matrix.autoretry_conn",
    bind=True,
    autoretry_for=(ConnectionError,),
    max_retries=3,
    retry_backoff=False,
    default_retry_delay=RETRY_DELAY_S,
)
@governed("chat")
def autoretry_conn(self: Task[Any, Any], calls: GovernedCalls, sub: str, n: int) -> str:
    """A ConnectionError once after the deferral: Celery's autoretry retries it."""
    run = _start(self, sub)
    if not self.request.retries:
        run.left("autoretry ConnectionError")
        raise ConnectionError("the body's own connection failed once")
    return _answer(run, calls, sub, n)


@app.task(
    name="matrix.autoretry_verdict",
    bind=True,
    autoretry_for=(AllSourcesExhausted,),
    max_retries=3,
    retry_backoff=False,
    default_retry_delay=RETRY_DELAY_S,
)
@governed("chat")
def autoretry_verdict(self: Task[Any, Any], calls: GovernedCalls, sub: str, n: int) -> str:
    """A retry_exhausted verdict once after the deferral: Celery's autoretry retries it."""
    run = _start(self, sub)
    if not self.request.retries:
        run.left("autoretry retry_exhausted")
        raise AllSourcesExhausted("retry_exhausted", "chat", RETRY_DELAY_S, attempts=2)
    return _answer(run, calls, sub, n)


@app.task(name="matrix.explicit_retry", bind=True, max_retries=3)
@governed("chat")
def explicit_retry(self: Task[Any, Any], calls: GovernedCalls, sub: str, n: int) -> str:
    """``self.retry(countdown=0.2)`` once after the deferral."""
    run = _start(self, sub)
    if not self.request.retries:
        run.left("self.retry")
        raise self.retry(countdown=RETRY_DELAY_S)
    return _answer(run, calls, sub, n)


@app.task(name="matrix.replacer", bind=True)
@governed("chat")
def replacer(self: Task[Any, Any], calls: GovernedCalls, sub: str, n: int) -> str:
    """Deferred once, then replaces itself by `target` (same task id, a new message)."""
    run = _start(self, sub, role="replacer")
    run.left("replace")
    raise self.replace(target.s(sub, n))


@app.task(name="matrix.target", bind=True)
@governed("chat")
def target(self: Task[Any, Any], calls: GovernedCalls, sub: str, n: int) -> str:
    """The replacement: a governed task like `bound` (deferred on its own first run)."""
    return _answer(_start(self, sub), calls, sub, n)


@app.task(name="matrix.reusing", bind=True)
@governed("chat", reuse_results=True)
def reusing(self: Task[Any, Any], calls: GovernedCalls, sub: str, n: int) -> str:
    """Sent twice with one explicit task id: the second must not get the first's answer."""
    return _answer(_start(self, sub), calls, sub, n)


@app.task(name="matrix.follow", bind=True)
def follow(self: Task[Any, Any], value: Any, sub: str) -> str:
    """A plain chain step or link: records that it ran."""
    run = Run(self, sub, "follow")
    return str(run.end(f"follow({value})"))


@app.task(name="matrix.echo", bind=True)
def echo(self: Task[Any, Any], sub: str) -> str:
    """A plain chord member."""
    run = Run(self, sub, "echo")
    return str(run.end(f"echo:{sub}"))


@app.task(name="matrix.collect", bind=True)
def collect(self: Task[Any, Any], values: list[Any], sub: str) -> list[str]:
    """A chord body."""
    run = Run(self, sub, "collect")
    result = sorted(str(v) for v in values)
    run.end(result)
    return result
