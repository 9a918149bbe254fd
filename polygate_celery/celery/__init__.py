"""Celery edge: governed tasks, deferred redelivery and the worker configuration.

from polygate_celery.celery import configure_worker, governed

configure_worker(app, load_config())

@app.task
@governed("summarise")
def summarise(calls, doc_id): ...
"""

try:
    import celery as _celery  # noqa: F401
    import kombu.transport.redis as _redis_transport  # noqa: F401
except ImportError as exc:
    raise ImportError(
        f"polygate_celery.celery needs Celery with its Redis transport ({exc.name} is "
        "missing): pip install 'polygate_celery[celery]'",
        name=exc.name,
    ) from exc

from polygate_celery.celery.deferral import DEFERRED
from polygate_celery.celery.handle import AsyncGovernedCalls, GovernedCalls
from polygate_celery.celery.runtime import RuntimeParts, reset_runtime, set_runtime_parts
from polygate_celery.celery.signals import task_deferred
from polygate_celery.celery.task import governed
from polygate_celery.celery.worker import configure_worker
from polygate_celery.errors import DeferralBudgetExceeded, PoisonMessage

# What a Celery app uses. The machinery (the parking lot, its releaser, run identities,
# the worker runtime) stays importable from its own module.
__all__ = [
    "DEFERRED",
    "AsyncGovernedCalls",
    "DeferralBudgetExceeded",
    "GovernedCalls",
    "PoisonMessage",
    "RuntimeParts",
    "configure_worker",
    "governed",
    "reset_runtime",
    "set_runtime_parts",
    "task_deferred",
]
