"""The Celery app of `celery_priorities.py`: one governed task, its broker's priorities on.

Its workers read their configuration from ``POLYGATE_CONFIG``, the broker and result
backend from ``BENCH_BROKER`` and ``BENCH_BACKEND``; with ``BENCH_CLASSES=1`` each call
names its priority class (the configuration declares them), else the governance knows
no classes and only the broker orders the tasks.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from polygate_celery import load_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = "bench-priority"
CLASSES = os.environ.get("BENCH_CLASSES") == "1"

app = Celery("polygate_priority_bench")
app.conf.update(
    broker_url=BROKER,
    result_backend=os.environ.get("BENCH_BACKEND", BROKER),
    task_default_queue=QUEUE,
    task_acks_late=True,  # as Celery's guide has it for priorities: one task reserved at a time
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
if BROKER.startswith("redis"):  # Redis: a list per step, 0 the highest
    app.conf.broker_transport_options = {
        "priority_steps": list(range(10)),
        "sep": ":",
        "queue_order_strategy": "priority",
    }
else:  # RabbitMQ: a priority queue, 9 the highest here
    app.conf.task_queues = [
        Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE, queue_arguments={"x-max-priority": 9})
    ]
if os.environ.get("POLYGATE_CONFIG"):
    configure_worker(app, load_config())


@app.task
@governed("summarise")
def summarise(calls: GovernedCalls, sent_at: float, kind: str) -> dict[str, Any]:
    """One call; how long after it was sent the task started, and its call was admitted."""
    started = time.time()
    result = calls.chat(
        [{"role": "user", "content": "summarise"}], priority=kind if CLASSES else None
    )
    first = result.attempts[0].started_s if result.attempts else 0.0
    return {"kind": kind, "queued_s": started - sent_at, "admitted_s": started - sent_at + first}
