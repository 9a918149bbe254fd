"""The `[celery]` extra's check: a Celery app with one governed task, as a user writes it.
The worker (``celery -A smoke_tasks worker``) and the client both import it."""

from __future__ import annotations

import os

from celery import Celery

from polygate_celery import load_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed

app = Celery(
    "polygate_smoke", broker=os.environ["SMOKE_BROKER"], backend=os.environ["SMOKE_BROKER"]
)
app.conf.task_default_queue = os.environ["SMOKE_QUEUE"]
if os.environ.get("POLYGATE_CONFIG"):
    configure_worker(app, load_config())


@app.task
@governed("chat")
def ask(calls: GovernedCalls, text: str) -> str:
    return calls.chat([{"role": "user", "content": text}]).value.text
