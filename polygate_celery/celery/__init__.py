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

from polygate_celery.celery.deferral import DEFERRED, DeferralState, deferral_delay
from polygate_celery.celery.handle import AsyncGovernedCalls, GovernedCalls
from polygate_celery.celery.identity import DEFERRALS, SUBMISSION, RunIdentity
from polygate_celery.celery.parking import ParkingLot, Releaser, lot_name
from polygate_celery.celery.runtime import (
    RuntimeParts,
    WorkerRuntime,
    reset_runtime,
    runtime_for,
    set_runtime_parts,
)
from polygate_celery.celery.signals import task_deferred
from polygate_celery.celery.task import governed
from polygate_celery.celery.worker import (
    check_eviction_policy,
    configure_worker,
    start_release_loop,
    time_limits,
)
from polygate_celery.errors import PoisonMessage

__all__ = [
    "DEFERRALS",
    "DEFERRED",
    "SUBMISSION",
    "AsyncGovernedCalls",
    "DeferralState",
    "GovernedCalls",
    "ParkingLot",
    "PoisonMessage",
    "Releaser",
    "RunIdentity",
    "RuntimeParts",
    "WorkerRuntime",
    "check_eviction_policy",
    "configure_worker",
    "deferral_delay",
    "governed",
    "lot_name",
    "reset_runtime",
    "runtime_for",
    "set_runtime_parts",
    "start_release_loop",
    "task_deferred",
    "time_limits",
]
