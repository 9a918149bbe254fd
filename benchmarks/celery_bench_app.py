"""The Celery app of `benchmarks/celery_deferral.py`: the tasks its `celery worker`s run.

Workers import it as ``-A benchmarks.celery_bench_app``; they read their
configuration from ``POLYGATE_CONFIG`` (a TOML file the benchmark writes), and
their broker and result backend from ``POLYGATE_BENCH_BROKER``. With a
configuration, `configure_worker` is applied, as a real deployment would.
``POLYGATE_BENCH_ETA_LIMIT=none`` then removes its ``worker_eta_task_limit``
(for an informational countdown figure only).
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import redis as sync_redis
from celery import Celery

from polygate_celery import AllSourcesExhausted, load_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed
from polygate_celery.celery.identity import DEFERRALS

BROKER = os.environ.get("POLYGATE_BENCH_BROKER", "redis://127.0.0.1:6379/10")
COUNTERS = os.environ.get("POLYGATE_BENCH_COUNTERS", "{polygate-bench}:bench")
HELLO = [{"role": "user", "content": "hello"}]

app = Celery("polygate_bench")
app.conf.broker_url = BROKER
app.conf.result_backend = BROKER
app.conf.task_default_queue = os.environ.get("POLYGATE_BENCH_QUEUE", "polygate-bench")
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
if os.environ.get("POLYGATE_CONFIG"):
    APPLIED = configure_worker(app, load_config())
    if os.environ.get("POLYGATE_BENCH_ETA_LIMIT") == "none":
        app.conf.worker_eta_task_limit = None

_clients: dict[str, Any] = {}


def _client(kind: str) -> Any:
    """One client of each kind per process, made on first use (after any fork)."""
    key = f"{kind}:{os.getpid()}"
    if key not in _clients:
        if kind == "redis":
            _clients[key] = sync_redis.Redis.from_url(BROKER)
        else:
            _clients[key] = httpx.Client(timeout=10.0)
    return _clients[key]


def count(name: str) -> None:
    """Count a run where the benchmark reads it (one INCR)."""
    _client("redis").incr(f"{COUNTERS}:{name}")


# -- deferral: 10,000 tasks deferred at once, then released ---------------------------------


@app.task(bind=True)
@governed("bench")
def defer_once(self: Any, calls: GovernedCalls, retry_after_s: float, due_at: float = 0.0) -> str:
    """Deferred on its first run (as a stalled scope would), done on the next.

    `due_at` (epoch seconds), when given, replaces `retry_after_s`: the task is
    then due at that moment, whatever time its first run parks it.
    """
    if (self.request.headers or {}).get(DEFERRALS, 0) == 0:
        count("first")
        wait = max(0.0, due_at - time.time()) if due_at else retry_after_s
        raise AllSourcesExhausted("stalled", "bench", wait)
    count("again")
    return "done"


# -- throughput: governed against plain, on the same worker ---------------------------------


@app.task
def plain_noop() -> None:
    return None


@app.task
@governed("bench")
def governed_noop(calls: GovernedCalls) -> None:
    return None


@app.task
def plain_call(base_url: str, model: str) -> str:
    """The same request a governed call makes, sent directly with httpx."""
    response = _client("http").post(
        f"{base_url}/chat/completions", json={"model": model, "messages": HELLO}
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


@app.task
@governed("bench")
def governed_call(calls: GovernedCalls) -> str:
    return calls.chat(HELLO).value.text
