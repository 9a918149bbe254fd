"""The Celery app of `benchmarks/goodput.py`: the same chat task, written four ways.

Workers import it as ``-A benchmarks.goodput_app``. The harness sets, per run:
``GOODPUT_BROKER`` (broker and result backend), ``GOODPUT_PROVIDER_URL``,
``GOODPUT_MODEL``, ``GOODPUT_API_KEY``, ``GOODPUT_COUNTERS`` (a Redis key prefix
for the figures the workers report) and ``GOODPUT_QUEUE``; for the governed
contender also ``POLYGATE_CONFIG``, and `configure_worker` is applied as a real
deployment would.

Each contender is what its users would write:

- ``openai_default``: the openai client with its own default retries (2, which
  honour a Retry-After of up to two minutes by sleeping in the worker);
- ``celery_autoretry``: ``autoretry_for`` + ``retry_backoff`` + ``retry_jitter``
  + ``max_retries=5``, the client's retries off;
- ``tenacity``: the openai cookbook's ``@retry(wait=wait_random_exponential(min=1,
  max=60), stop=stop_after_attempt(6))`` around the call, the client's retries off;
- ``polygate``: a governed task (`polygate_celery.celery.governed`).

Every task execution adds its wall time to ``<counters>:worker_s`` (task_prerun
to task_postrun), so the harness can tell worker time spent waiting from time
spent in requests.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import openai
import redis as sync_redis
from celery import Celery, signals
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from polygate_celery import load_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed
from polygate_celery.telemetry import DeferralEvent, Event, VerdictEvent

BROKER = os.environ.get("GOODPUT_BROKER", "redis://127.0.0.1:6379/11")
PROVIDER_URL = os.environ.get("GOODPUT_PROVIDER_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("GOODPUT_MODEL", "chat")
COUNTERS = os.environ.get("GOODPUT_COUNTERS", "goodput")
TIMEOUT_S = 10.0
RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError)

app = Celery("polygate_goodput", broker=BROKER, backend=BROKER)
app.conf.task_default_queue = os.environ.get("GOODPUT_QUEUE", "goodput")
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_hijack_root_logger = False
app.conf.task_serializer = app.conf.result_serializer = "json"

_local = threading.local()
_clients: dict[str, Any] = {}
_lock = threading.Lock()


def _client(kind: str) -> Any:
    """One client of each kind per process, made on first use, shared by its threads."""
    with _lock:
        if kind not in _clients:
            if kind == "redis":
                _clients[kind] = sync_redis.Redis.from_url(BROKER)
            else:
                retries = 2 if kind == "openai-default" else 0  # 2 is the client's default
                _clients[kind] = openai.OpenAI(
                    base_url=PROVIDER_URL,
                    api_key=os.environ.get("GOODPUT_API_KEY", "sk-none"),
                    timeout=TIMEOUT_S,
                    max_retries=retries,
                )
        return _clients[kind]


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Summarise item {i} in one line."}]


def _ask(kind: str, i: int) -> str:
    answer = _client(kind).chat.completions.create(model=MODEL, messages=prompt(i), max_tokens=30)
    return str(answer.choices[0].message.content)


# -- the contenders ---------------------------------------------------------------------------


@app.task
def openai_default(i: int) -> str:
    return _ask("openai-default", i)


@app.task(autoretry_for=RETRYABLE, retry_backoff=True, retry_jitter=True, max_retries=5)
def celery_autoretry(i: int) -> str:
    return _ask("openai-bare", i)


@retry(
    wait=wait_random_exponential(min=1, max=60),
    stop=stop_after_attempt(6),
    retry=retry_if_exception_type(RETRYABLE),
    reraise=True,
)
def _ask_with_tenacity(i: int) -> str:
    return _ask("openai-bare", i)


@app.task
def tenacity_retry(i: int) -> str:
    return _ask_with_tenacity(i)


@app.task
@governed("chat")
def polygate(calls: GovernedCalls, i: int) -> str:
    return calls.chat(prompt(i), max_tokens=30).value.text


# -- what the workers report ------------------------------------------------------------------


def count(name: str, amount: float = 1.0) -> None:
    _client("redis").incrbyfloat(f"{COUNTERS}:{name}", amount)


def report(event: Event) -> None:
    """Telemetry hook of the governed contender: deferrals and stalled verdicts."""
    if isinstance(event, DeferralEvent):
        count("deferrals")
    elif isinstance(event, VerdictEvent) and event.verdict == "stalled":
        count("stalled")


@signals.task_prerun.connect
def _started(task_id: str, **_: Any) -> None:
    _local.started = time.monotonic()


@signals.task_postrun.connect
def _ended(task_id: str, **_: Any) -> None:
    started = getattr(_local, "started", None)
    if started is not None:
        count("worker_s", time.monotonic() - started)
        count("executions")
        _local.started = None


if os.environ.get("POLYGATE_CONFIG"):
    configure_worker(app, load_config(), hooks=[report])
