"""The Celery app of the prefork tests on RabbitMQ (`test_rabbitmq_prefork.py`).

Workers in other processes import it: the broker from ``POLYGATE_RABBITMQ_BROKER``
(a vhost of the tests' own), results and the runs' notes in the Redis of
``POLYGATE_RABBITMQ_RESULTS``, the configuration from ``POLYGATE_CONFIG``.
"""

from __future__ import annotations

import os
from typing import Any

import redis as sync_redis
from celery import Celery

from polygate_celery import load_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed

QUEUE = "polygate-rabbitmq-prefork"
app = Celery("polygate_rabbitmq_prefork")
app.conf.broker_url = os.environ.get("POLYGATE_RABBITMQ_BROKER", "amqp://guest@127.0.0.1//")
app.conf.result_backend = os.environ.get("POLYGATE_RABBITMQ_RESULTS", "redis://127.0.0.1:6379/10")
app.conf.task_default_queue = QUEUE
if os.environ.get("POLYGATE_CONFIG"):
    configure_worker(app, load_config(), extra_task_s=20)


@app.task(bind=True)
@governed()
def ask_in(self: Any, calls: GovernedCalls, scope: str, fail_fast: bool = False) -> str:
    """One governed call in `scope`; each run notes its process in ``runs:<task id>``."""
    with sync_redis.Redis.from_url(app.conf.result_backend) as client:
        client.rpush(f"runs:{self.request.id}", os.getpid())
    hello = [{"role": "user", "content": "hello"}]
    return calls.chat(hello, scope=scope, fail_fast=fail_fast).value.text
