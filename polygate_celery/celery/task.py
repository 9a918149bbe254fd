"""Celery edge: `@governed`, the decorator that makes a Celery task's model calls governed.

Put it under Celery's own decorator::

    @app.task                       # or @shared_task, bind=True, queue=..., any options
    @governed("summarise")
    def summarise(calls, doc_id):   # `calls` is given by the decorator, callers omit it
        return calls.chat([{"role": "user", "content": text_of(doc_id)}]).value.text

What the body's calls end in decides the task's fate (SPEC §6):

| verdict                                              | task                          |
|------------------------------------------------------|-------------------------------|
| success                                              | SUCCESS with the return value |
| `AllSourcesExhausted` stalled, fail_fast or deadline | deferred: re-enqueued, later  |
| `GovernanceBackendError`                             | deferred likewise, or handed  |
|                                                      | back unacknowledged           |
| `AllSourcesExhausted` retry_exhausted                | FAILURE with the verdict      |
| `SourceFatalError`                                   | FAILURE at once               |
| deferral budget spent                                | FAILURE, DeferralBudgetExceeded|

With ``bind=True``, name the task's first parameter ``self``; the handle comes
second. An ``async def`` body gets an `AsyncGovernedCalls` and runs on the
worker's event loop.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, cast

from celery import Task
from celery._state import get_current_task
from celery.exceptions import Ignore, Reject, Retry

from polygate_celery.celery.deferral import DeferralState, defer
from polygate_celery.celery.guard import ExecutionGuard
from polygate_celery.celery.handle import AsyncGovernedCalls, GovernedCalls
from polygate_celery.celery.runtime import runtime_for
from polygate_celery.errors import AllSourcesExhausted, GovernanceBackendError, PolygateError

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("polygate_celery")


class PoisonMessage(PolygateError):
    """A task message whose every run lost its worker: failed instead of redelivered again."""

    def __init__(self, task_id: str, redeliveries: int) -> None:
        self.task_id = task_id
        self.redeliveries = redeliveries
        super().__init__(task_id, redeliveries)

    def __str__(self) -> str:
        return f"task {self.task_id} lost its worker more than {self.redeliveries} times"


def governed(
    scope: str | None = None, *, reuse_results: bool = False, bound: bool | None = None
) -> Callable[[F], F]:
    """Give a task body a handle for governed calls and map their verdicts onto Celery.

    `scope` is the calls' default scope. With `reuse_results`, results a run
    already paid for are kept and reused when the task runs again after a
    deferral. `bound` says whether Celery binds the task (default: the first
    parameter is named ``self``).
    """

    def decorate(fn: F) -> F:
        parameters = list(inspect.signature(fn).parameters.values())
        is_bound = bound if bound is not None else bool(parameters) and parameters[0].name == "self"
        handle_at = 1 if is_bound else 0
        if len(parameters) <= handle_at:
            raise TypeError(f"{fn.__qualname__} needs a parameter for its governed calls")
        is_async = inspect.iscoroutinefunction(fn)

        @functools.wraps(fn)
        def run_task(*args: Any, **kwargs: Any) -> Any:
            task = args[0] if is_bound and args and isinstance(args[0], Task) else current()
            return _run(task, fn, args, kwargs, handle_at, is_async, scope, reuse_results)

        del run_task.__wrapped__  # Celery must see the signature without the handle
        visible = parameters[:handle_at] + parameters[handle_at + 1 :]
        run_task.__signature__ = inspect.signature(fn).replace(parameters=visible)  # type: ignore[attr-defined]
        run_task.__polygate_governed__ = True  # type: ignore[attr-defined]
        return cast(F, run_task)

    return decorate


def current() -> Task[Any, Any]:
    task = get_current_task()
    if task is None:
        raise RuntimeError("a governed task body ran outside a Celery task")
    return task


def _run(
    task: Task[Any, Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    handle_at: int,
    is_async: bool,
    scope: str | None,
    reuse: bool,
) -> Any:
    runtime = runtime_for(task.app)
    deferrals = DeferralState.of(task).count
    guard = ExecutionGuard(runtime, task, deferrals)
    try:
        verdict = guard.begin()
    except GovernanceBackendError as exc:
        # The store cannot tell copies apart now; the broker can still hold the task.
        _defer(task, exc, runtime, guard, strategy="countdown")
    if verdict == "poison":
        raise PoisonMessage(str(task.request.id), runtime.config.deferral.redelivery_cap)
    if verdict in ("done", "running"):
        raise Ignore()  # a copy of a run that finished, or is running elsewhere
    calls = AsyncGovernedCalls(
        runtime, str(task.request.id), scope, reuse=reuse, rerun=deferrals > 0
    )
    handle = calls if is_async else GovernedCalls(calls)
    call_args = (*args[:handle_at], handle, *args[handle_at:])
    try:
        result = runtime.run(fn(*call_args, **kwargs)) if is_async else fn(*call_args, **kwargs)
    except AllSourcesExhausted as exc:
        if exc.reason == "retry_exhausted":
            _quietly(guard.finish)
            raise
        _defer(task, exc, runtime, guard)
    except GovernanceBackendError as exc:
        _defer(task, exc, runtime, guard)
    except Retry:
        _quietly(guard.release)  # Celery republished the message: its next copy must run
        raise
    except (Ignore, Reject):
        raise
    except BaseException:
        _quietly(guard.finish)
        raise
    _quietly(guard.finish)  # a marker that fails to be set never costs the task its result
    return result


def _defer(
    task: Task[Any, Any],
    verdict: Any,
    runtime: Any,
    guard: ExecutionGuard,
    strategy: str | None = None,
) -> NoReturn:
    try:
        defer(task, verdict, runtime, strategy=strategy)
    except Ignore:
        _quietly(guard.finish)  # deferred: this message's run is over
        raise
    except Reject:
        raise  # handed back to the broker: the message will run again
    except BaseException:
        _quietly(guard.finish)
        raise


def _quietly(step: Callable[[], None]) -> None:
    """A guard marker only drops copies: failing to write one loses nothing."""
    try:
        step()
    except Exception:
        logger.warning("recording a governed task's run failed", exc_info=True)
