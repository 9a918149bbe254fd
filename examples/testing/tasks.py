"""A user's Celery app with one governed task."""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

from polygate_celery import load_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed

CONFIG = load_config(Path(__file__).with_name("polygate.toml"))
app = Celery(
    "shop",
    broker=os.environ["SHOP_REDIS_URL"],
    backend=os.environ["SHOP_REDIS_URL"],
)
configure_worker(app, CONFIG)


@app.task
@governed("summarise")
def summarise(calls: GovernedCalls, text: str) -> str:
    answer = calls.chat([{"role": "user", "content": f"Summarise: {text}"}])
    return str(answer.value.text)
