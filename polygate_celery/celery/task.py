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
| `ConfigError` (an undeclared class, a bad tenant...) | FAILURE, never retried        |

With ``bind=True``, name the task's first parameter ``self``; the handle comes
second. An ``async def`` body gets an `AsyncGovernedCalls` and runs on the
worker's event loop. The priority class and tenant of the calls:
`polygate_celery.celery.priority`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from celery import Task, signals
from celery._state import get_current_task
from celery.exceptions import Ignore, Reject
from celery.local import Proxy
from kombu.exceptions import EncodeError

# The worker-start check: connected as this module is imported, and importable from here.
from polygate_celery.celery.checks import check_governed_tasks  # noqa: F401
from polygate_celery.celery.deferral import defer, requeue_copy, trace_of
from polygate_celery.celery.guard import ExecutionGuard, patiently, quietly
from polygate_celery.celery.handle import AsyncGovernedCalls, GovernedCalls
from polygate_celery.celery.identity import RunIdentity
from polygate_celery.celery.priority import RunStanding, TenantArgument, run_standing
from polygate_celery.celery.registry import GOVERNED, PRIORITY, SCOPE
from polygate_celery.celery.runtime import WorkerRuntime, runtime_for
from polygate_celery.errors import (
    AllSourcesExhausted,
    ConfigError,
    GovernanceBackendError,
    PoisonMessage,
)
from polygate_celery.telemetry import run_trace

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("polygate_celery")


def governed(
    scope: str | None = None,
    *,
    priority: str | None = None,
    tenant_arg: str | None = None,
    reuse_results: bool = False,
    bound: bool | None = None,
) -> Callable[[F], F]:
    """Give a task body a handle for governed calls and map their verdicts onto Celery.

    Put it below Celery's own decorator (``@app.task``, then ``@governed(...)``).
    The body's first parameter (its second with ``bind=True``) receives a
    `GovernedCalls`, or an `AsyncGovernedCalls` for an ``async def`` body;
    callers of the task leave it out. A verdict that the scope is unavailable
    defers the task (it runs again later); ``retry_exhausted``, a fatal request
    and a spent deferral budget fail it.

    Args:
        scope: The calls' default scope (a call may name another).
        priority: The class of the task's calls, declared in ``[priorities]``
            (None: the configuration's default class). A message's header
            ``polygate_priority`` names another for that message; a call's own
            ``priority=`` wins over both.
        tenant_arg: The body's parameter whose value is the tenant of its calls,
            given by position or keyword. Without it, or when its value is None,
            the message's header ``polygate_tenant`` names the tenant, if any; a
            call's own ``tenant=`` wins over both.
        reuse_results: Keep each result a run paid for, and reuse it when the
            task runs again after a deferral instead of asking the provider again.
        bound: Whether Celery binds the task. Default: the first parameter is
            named ``self``.

    Returns:
        The decorator.

    Raises:
        TypeError: When it decorates: it was put above ``@app.task``, the body
            has no parameter for the handle, or none named `tenant_arg`.
    """

    def decorate(fn: F) -> F:
        if isinstance(fn, (Task, Proxy)):
            raise TypeError(
                f"@governed is above @app.task on {getattr(fn, 'name', fn)!r}: put it below "
                "(@app.task, then @governed(...), then def), so that Celery runs the governed body"
            )
        parameters = list(inspect.signature(fn).parameters.values())
        is_bound = bound if bound is not None else bool(parameters) and parameters[0].name == "self"
        handle_at = 1 if is_bound else 0
        if len(parameters) <= handle_at:
            raise TypeError(f"{fn.__qualname__} needs a parameter for its governed calls")
        is_async = inspect.iscoroutinefunction(fn)
        visible = parameters[:handle_at] + parameters[handle_at + 1 :]
        tenant_from = None
        if tenant_arg is not None:
            tenant_from = TenantArgument(visible, handle_at, tenant_arg, fn.__qualname__)

        @functools.wraps(fn)
        def run_task(*args: Any, **kwargs: Any) -> Any:
            task = args[0] if is_bound and args and isinstance(args[0], Task) else current()
            _hand_back_unpublished_retries(task)
            runtime = runtime_for(task.app)
            # Once per run; a ConfigError here fails the task before its body starts.
            standing = run_standing(task, runtime.config, priority, tenant_from, args, kwargs)
            with _traced(task, runtime):
                return _run(
                    task,
                    runtime,
                    fn,
                    args,
                    kwargs,
                    handle_at,
                    is_async,
                    scope,
                    reuse_results,
                    standing,
                )

        del run_task.__wrapped__  # Celery must see the signature without the handle
        run_task.__signature__ = inspect.signature(fn).replace(parameters=visible)  # type: ignore[attr-defined]
        setattr(run_task, GOVERNED, True)
        setattr(run_task, SCOPE, scope)
        setattr(run_task, PRIORITY, priority)
        return cast(F, run_task)

    return decorate


def current() -> Task[Any, Any]:
    task = get_current_task()
    if task is None:
        raise RuntimeError("a governed task body ran outside a Celery task")
    return task


@contextlib.contextmanager
def _traced(task: Task[Any, Any], runtime: WorkerRuntime) -> Iterator[None]:
    """While hooks listen, the run's trace context is theirs to read (a deferred
    message's link) and to set (what a deferral carries on); its calls inherit it."""
    if not runtime.telemetry.active:
        yield
        return
    token = run_trace.set(trace_of(task))
    try:
        yield
    finally:
        run_trace.reset(token)


def _run(
    task: Task[Any, Any],
    runtime: WorkerRuntime,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    handle_at: int,
    is_async: bool,
    scope: str | None,
    reuse: bool,
    standing: RunStanding,
) -> Any:
    run = RunIdentity.of(task)
    guard = ExecutionGuard.of(runtime, task, run)
    rerun = run.deferrals > 0 or guard.copy  # kept results may exist
    # Kept per submission and Celery retry: a retry asks again (its answer was refused).
    kept_as = f"{run.submission_key}:{run.retries}"
    calls = AsyncGovernedCalls(
        runtime,
        kept_as,
        scope,
        reuse=reuse,
        rerun=rerun,
        priority=standing.priority,
        tenant=standing.tenant,
    )
    handle = calls if is_async else GovernedCalls(calls)
    call_args = (*args[:handle_at], handle, *args[handle_at:])

    def body() -> Any:
        return runtime.run(fn(*call_args, **kwargs)) if is_async else fn(*call_args, **kwargs)

    if task.request.is_eager or task.request.called_directly:
        return _run_eagerly(task, body)  # no message to defer, nor copies to guard against
    try:
        verdict = guard.begin()
    except GovernanceBackendError as exc:
        # The store cannot tell copies apart now; the broker can still hold the task.
        with _deferring(guard):
            defer(task, exc, runtime, guard, strategy="countdown")
    if verdict == "poison":
        raise PoisonMessage(str(task.request.id), runtime.config.deferral.redelivery_cap)
    if verdict == "done":
        raise Ignore()  # a copy of a run whose outcome is final
    if verdict == "running":
        requeue_copy(task, runtime, guard)  # a copy of a live run: not beside it
    try:
        result = body()
    except AllSourcesExhausted as exc:
        if exc.reason == "retry_exhausted":
            finish_after_return(task, guard)
            raise
        with _deferring(guard):
            defer(task, exc, runtime, guard)
    except GovernanceBackendError as exc:
        with _deferring(guard):
            defer(task, exc, runtime, guard)
    except Reject as exc:
        if getattr(exc, "requeue", False):  # back to the broker: the run goes on
            quietly(guard.hand_back if getattr(exc, HANDED_BACK, False) else guard.release)
            raise
        finish_after_return(task, guard)
        raise
    except Exception:
        # Final: a failure (acknowledged), Ignore (Task.replace), Retry (the retry is a
        # message of its own, with retries + 1), or an error autoretry_for turns into one.
        finish_after_return(task, guard)
        raise
    except BaseException:
        # SystemExit, KeyboardInterrupt: Celery terminated the run (cold shutdown, broker
        # connection lost) and will restore its message; the copy must run.
        quietly(guard.release)
        raise
    finish_after_return(task, guard)  # a marker that fails to be set never costs the result
    return result


HANDED_BACK = "polygate_handed_back"


def _hand_back_unpublished_retries(task: Task[Any, Any]) -> None:
    """Make `task.retry` hand the message back to the broker when the retry cannot be
    published, where Celery would drop it (``Reject(requeue=False)``): the run is left
    unfinished and runs again on redelivery. Installed once per task object, so it holds
    for ``self.retry()`` in the body and for ``autoretry_for`` (which calls `task.retry`
    after the body has ended). Each hand-back counts toward `redelivery_cap`, so a
    publish that fails every time ends as `PoisonMessage`, not in a loop. A retry that
    cannot be encoded is dropped at once, as Celery does. A retry for a `ConfigError` (an
    undeclared class, a malformed tenant, a missing scope) is not made: the error is
    raised, and the task fails; no retry mends a configuration (``autoretry_for=(Exception,)``
    would otherwise retry it ``max_retries`` times, or forever).

    A wrapper, because Celery has no hook there: ``Task.retry`` raises that Reject
    itself (``on_retry`` comes only after a retry was published), and a base class of
    ours would not reach tasks that name their own ``base=``."""
    if "retry" in vars(task):
        return
    celery_retry = task.retry

    @functools.wraps(celery_retry)
    def retry(*args: Any, **kwargs: Any) -> Any:
        reason = kwargs.get("exc", args[2] if len(args) > 2 else None)
        if isinstance(reason, ConfigError):
            raise reason
        try:
            return celery_retry(*args, **kwargs)
        except Reject as exc:
            reason = getattr(exc, "reason", None)
            if getattr(exc, "requeue", True) or not isinstance(reason, Exception):
                raise
            if isinstance(reason, EncodeError):
                raise
            guard = _take_pending_finish(task)
            if guard is not None:  # autoretry_for: the body has ended; leave it unfinished
                quietly(guard.hand_back)
            logger.warning(
                "task %s: its retry could not be published (%s); handed back to the broker",
                task.request.id,
                type(reason).__name__,
            )
            handed_back = Reject(reason, requeue=True)
            setattr(handed_back, HANDED_BACK, True)  # the body's guard counts it (`_run`)
            raise handed_back from exc

    task.retry = retry  # type: ignore[method-assign]


# The key, in Celery's request context of a run (its per-run object, on the task's request
# stack until after ``task_postrun``), of the guard whose finish waits for the outcome.
PENDING_FINISH = "polygate_pending_finish"


def finish_after_return(task: Task[Any, Any], guard: ExecutionGuard) -> None:
    """Mark the run finished once Celery has stored its outcome and sent its callbacks
    (``task_postrun``), not before: a worker lost in between leaves the run unfinished,
    and the message's copy runs (at least once) instead of being dropped.

    Celery's ``after_return`` hook would come at the same point, but only for a task
    class that defines it (a user's ``base=`` need not) and not for a retry, an
    ``Ignore`` or a ``Reject``: the signal comes for every run."""
    task.request.update({PENDING_FINISH: guard})


def _take_pending_finish(task: Task[Any, Any]) -> ExecutionGuard | None:
    guard = task.request.get(PENDING_FINISH, None)
    if guard is None:
        return None
    task.request.update({PENDING_FINISH: None})
    return guard if isinstance(guard, ExecutionGuard) else None


def _finish_returned_run(sender: Any = None, **_: Any) -> None:
    guard = _take_pending_finish(sender) if isinstance(sender, Task) else None
    if guard is not None:
        patiently(guard.finish)  # its outcome is stored: wait out a Redis restart


signals.task_postrun.connect(_finish_returned_run, weak=False)


def _run_eagerly(task: Task[Any, Any], body: Callable[[], Any]) -> Any:
    """Eager mode (``task_always_eager``, ``apply()``) or a direct call (``task(...)``):
    nothing can be re-enqueued, so a verdict that would defer the task is raised, with
    a note saying so."""
    try:
        return body()
    except (AllSourcesExhausted, GovernanceBackendError) as exc:
        if isinstance(exc, AllSourcesExhausted) and exc.reason == "retry_exhausted":
            raise
        logger.warning(
            "task %s ran eagerly: its verdict (%s) would defer it in a worker; raised instead",
            task.request.id,
            getattr(exc, "reason", "backend_error"),
        )
        exc.add_note(EAGER_NOTE)
        raise


EAGER_NOTE = (
    "polygate_celery: this task ran eagerly (task_always_eager, apply() or a direct "
    "call), where a deferral cannot re-enqueue it; in a worker it would have been deferred"
)


@contextlib.contextmanager
def _deferring(guard: ExecutionGuard) -> Iterator[None]:
    """Around a deferral (`defer`, which never returns): one that ends the run (Ignore) or
    hands its message back (Reject) passes; one that fails ends the run for good (the
    deferral budget is spent: FAILURE, final), one interrupted releases it (nothing was
    handed on)."""
    try:
        yield
    except (Ignore, Reject):
        raise
    except Exception:
        quietly(guard.finish)
        raise
    except BaseException:
        quietly(guard.release)
        raise
