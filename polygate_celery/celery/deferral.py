"""Celery edge: deferring a task whose scope cannot serve now, instead of failing it.

A deferral re-enqueues the same task (id, args, kwargs, headers, links, chain
and chord) to run after a delay, without touching Celery's retry count: the
number of deferrals travels in a message header. The delay is the verdict's
`retry_after_s`, grown per earlier deferral that waited out an estimate (a
deferral until rate limits reset is not grown, nor does it count), capped and
stretched by a random jitter (never made shorter than the estimate). When the
budget (`max_deferrals`, `max_defer_age_s`) is spent, the task fails with
`DeferralBudgetExceeded`.

Every deferral sends a Celery event ``task-deferred`` with its due time, and
the `task_deferred` signal (`polygate_celery.celery.signals`), so monitoring
shows the task as deferred rather than running. In eager mode
(``task_always_eager``) nothing can be re-enqueued: the verdict is raised.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject

from polygate_celery.celery.broker import unacked_window_s
from polygate_celery.celery.guard import ExecutionGuard, quietly
from polygate_celery.celery.identity import COPY, DEFERRALS
from polygate_celery.celery.parking import (
    broker_retrying,
    capture_message,
    lot_name,
    starved_index,
)
from polygate_celery.celery.runtime import WorkerRuntime
from polygate_celery.celery.signals import task_deferred
from polygate_celery.celery.worker import start_release_loop
from polygate_celery.config.models import DeferralConfig
from polygate_celery.errors import (
    AllSourcesExhausted,
    DeferralBudgetExceeded,
    GatewayUnavailableError,
)
from polygate_celery.telemetry import DeferralEvent, RunTrace, run_trace

# The most a deferral waiting for a rate-limit reset is stretched by the jitter.
RESET_SPREAD_S = 1.0

logger = logging.getLogger("polygate_celery")
GROWN = "polygate_grown"  # how many of them were grown (waited out an estimate)
# The W3C trace context (traceparent, tracestate) of the call whose verdict deferred the
# task, when a tracing hook listens: the next run's calls link to it.
TRACE = "polygate_trace"
FIRST_DEFERRED_AT = "polygate_first_deferred_at"
DEFERRED = "DEFERRED"  # the task state while it waits to run again


@dataclass(frozen=True, slots=True)
class DeferralState:
    """What a task's message says of its deferrals so far."""

    count: int = 0
    first_at: float | None = None
    grown: int = 0  # deferrals that waited out an estimate: the next delay's growth exponent

    @classmethod
    def of(cls, task: Task[Any, Any]) -> DeferralState:
        headers = task.request.headers or {}
        count = _count(headers.get(DEFERRALS)) or 0
        first = headers.get(FIRST_DEFERRED_AT)
        grown = _count(headers.get(GROWN))
        return cls(
            count=count,
            first_at=float(first) if isinstance(first, (int, float)) else None,
            grown=count if grown is None else min(grown, count),  # a message from before GROWN
        )


def trace_of(task: Task[Any, Any]) -> RunTrace:
    """The trace context a run of `task` starts with: its message's `TRACE` header (a
    mapping of strings, else nothing), and how many times it was deferred before."""
    headers = task.request.headers or {}
    carried = headers.get(TRACE)
    previous = None
    if isinstance(carried, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in carried.items()
    ):
        previous = dict(carried)
    return RunTrace(previous=previous, deferrals=DeferralState.of(task).count)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def deferral_delay(
    retry_after_s: float, grown: int, config: DeferralConfig, u: float, grow: bool = True
) -> float:
    """``retry_after_s * growth**grown``, within [min, max], stretched by up to `jitter`.

    `grown` counts the task's earlier deferrals that waited out an estimate
    (a breaker's cooldown, an unknown reopening): a long outage backs off.

    Without `grow`, for a `retry_after_s` that is when rate limits reset (not an
    estimate), the delay is that reset, stretched by at most `RESET_SPREAD_S`:
    the capacity frees at the reset, and a task that came back later (or grown
    per deferral) would find it spent by others. Governance, not the deferral,
    keeps the returning tasks from overrunning the provider.
    """
    wanted = retry_after_s * config.growth ** min(grown, 64) if grow else retry_after_s
    base = min(config.max_delay_s, max(config.min_delay_s, wanted))
    spread = config.jitter * base if grow else min(RESET_SPREAD_S, config.jitter * base)
    return base + spread * u


@dataclass(frozen=True, slots=True)
class Deferral:
    """One deferral decided: the state its message carries on, and how long it waits."""

    state: DeferralState
    delay_s: float
    reason: str
    scope: str | None
    estimate_s: float
    reset: bool  # a wait for rate limits to reset: not grown


def next_deferral(
    state: DeferralState,
    verdict: GatewayUnavailableError,
    config: DeferralConfig,
    now: float,
    u: float,
) -> Deferral:
    """The deferral after `state` for `verdict`, at wall-clock time `now` (seconds since
    the epoch: the first deferral's time travels in the message to other workers) with
    the jitter's draw `u` in [0, 1).

    Raises:
        DeferralBudgetExceeded: `max_deferrals` or `max_defer_age_s` is spent.
    """
    first = state.first_at if state.first_at is not None else now
    count = state.count + 1
    scope = getattr(verdict, "scope", None)
    reason = verdict.reason if isinstance(verdict, AllSourcesExhausted) else "backend_error"
    estimate = verdict.retry_after_s if isinstance(verdict, AllSourcesExhausted) else 1.0
    if count > config.max_deferrals or now - first > config.max_defer_age_s:
        raise DeferralBudgetExceeded.after(verdict, state.count, now - first) from verdict
    reset = isinstance(verdict, AllSourcesExhausted) and verdict.rate_limited
    delay = deferral_delay(estimate, state.grown, config, u, grow=not reset)
    grown = state.grown if reset else state.grown + 1
    return Deferral(DeferralState(count, first, grown), delay, reason, scope, estimate, reset)


def countdown_cap_s(task: Task[Any, Any]) -> float:
    """The longest countdown whose run still ends within the broker's visibility timeout
    (Redis) or consumer timeout (RabbitMQ).

    An ETA message is unacknowledged from its delivery: its countdown and its
    run (up to the hard time limit) must both fit, or it would be redelivered
    while still running.
    """
    visibility = unacked_window_s(task.app)
    hard_limit = float(getattr(task, "time_limit", None) or task.app.conf.task_time_limit or 0)
    return max(1.0, visibility - hard_limit - 60.0)


def defer(
    task: Task[Any, Any],
    verdict: GatewayUnavailableError,
    runtime: WorkerRuntime,
    guard: ExecutionGuard,
    *,
    strategy: str | None = None,
) -> NoReturn:
    """Re-enqueue `task` to run later, and end this run without a result (Celery's Ignore).

    The deferring run is finished when the message is handed on; if handing it
    on fails, the message goes back to the broker unacknowledged (Reject) and
    the run is released, so its redelivery runs.
    """
    config = runtime.config.deferral
    now = runtime.wall_time()
    step = next_deferral(DeferralState.of(task), verdict, config, now, runtime.random())
    count, delay, reason, scope, estimate = (
        step.state.count,
        step.delay_s,
        step.reason,
        step.scope,
        step.estimate_s,
    )
    headers = guard.run.pinned(
        {**(task.request.headers or {}), DEFERRALS: count, GROWN: step.state.grown}
    )
    headers[FIRST_DEFERRED_AT] = step.state.first_at
    headers.pop(COPY, None)  # the next run is a new run, not a copy of this one
    trace = run_trace.get()
    if trace is not None and trace.latest:
        headers[TRACE] = dict(trace.latest)  # else an earlier run's, if any, goes on
    signature = task.signature_from_request(task.request, headers=headers)
    chosen = strategy or (config.strategy if runtime.redis is not None else "countdown")
    if chosen == "countdown":
        delay = min(delay, countdown_cap_s(task))
    _record_deferred(task, reason, scope, estimate, count, now + delay, chosen)
    entry = guard.run.deferred().key
    # An outage's deferral (not a wait for rate limits to reset) is indexed by its scope:
    # the scope's next success makes it due at once (`Lot.wake`); a class's starved by
    # others, by its scope and class: a success of that class's (the others' do not). A
    # task its tenant's caps held back is no outage's: it waits out its delay.
    capped = getattr(verdict, "capped_tenant", None) is not None
    outage = scope if reason == "stalled" and not step.reset and not capped else None
    starved_class = getattr(verdict, "starved_class", None)
    if outage is not None and starved_class is not None:
        outage = starved_index(outage, starved_class)
    if chosen == "park" and _park(task, runtime, entry, delay, signature, guard, outage):
        guard.forget()  # the lot marked this run finished as it took the message
    else:
        chosen = "countdown"  # the lot lives in the store's Redis; the broker may be up
        delay = min(delay, countdown_cap_s(task))
        _send_later(task, signature, delay, guard)
    logger.info(
        "task %s PARKED, not dropped: scope %r %s (sources: %s; last error: %s); "
        "runs again in %.1f s (%s)",
        task.request.id,
        scope,
        reason,
        _sources_of(verdict),
        _last_error_of(verdict),
        delay,
        "parking lot" if chosen == "park" else "broker countdown",
    )
    _announce(task, runtime, reason, scope, estimate, count, now, delay, chosen)
    raise Ignore()


def _sources_of(verdict: GatewayUnavailableError) -> str:
    """The sources the verdict's call tried, in order, for the deferral's log line."""
    trail = verdict.trail if isinstance(verdict, AllSourcesExhausted) else ()
    names = list(dict.fromkeys(record.source for record in trail))
    return ", ".join(names) if names else "none tried: refused before sending"


def _last_error_of(verdict: GatewayUnavailableError) -> str:
    if isinstance(verdict, AllSourcesExhausted):
        return verdict.last_error or "none"
    return str(verdict)  # the store could not answer


def requeue_copy(task: Task[Any, Any], runtime: WorkerRuntime, guard: ExecutionGuard) -> NoReturn:
    """Hold back a copy of a run whose heartbeat is alive: park it to look again once
    the live run's marker would have lapsed (later each time it finds the run still
    alive, up to `COPY_WAIT_MAX_S`), and drop this delivery."""
    cycles = _count(task.request.headers and task.request.headers.get(COPY)) or 0
    headers = guard.run.pinned({**(task.request.headers or {}), COPY: cycles + 1})
    signature = task.signature_from_request(task.request, headers=headers)
    wait = min(COPY_WAIT_MAX_S, max(guard.wait_s, 1.0) * 2 ** min(cycles, 6))
    delay = wait + 0.1 + 0.4 * runtime.random()  # random.uniform(0.1, 0.5)'s draw
    log = logger.warning if cycles == 0 else logger.info
    log("task %s: a copy of a live run arrived; it looks again in %.1f s", task.request.id, delay)
    if not _park(task, runtime, f"{guard.run.key}:copy", delay, signature, None):
        _send_later(task, signature, delay, None)
    raise Ignore()


# The longest a copy of a live run waits before it looks again.
COPY_WAIT_MAX_S = 60.0


def _send_later(
    task: Task[Any, Any], signature: Any, delay: float, guard: ExecutionGuard | None
) -> None:
    try:
        for attempt in broker_retrying():
            with attempt:
                signature.apply_async(countdown=delay)
    except Exception as exc:
        # Neither acknowledged nor lost: back to the broker, which redelivers it.
        logger.error("deferring task %s failed; handing it back", task.request.id)
        if guard is not None:
            quietly(guard.release)
        raise Reject(f"could not defer: {type(exc).__name__}", requeue=True) from exc
    if guard is not None:
        quietly(guard.finish)


def _park(
    task: Task[Any, Any],
    runtime: WorkerRuntime,
    entry: str,
    delay: float,
    signature: Any,
    guard: ExecutionGuard | None,
    outage: str | None = None,
) -> bool:
    """Park the message under `entry` (ending `guard`'s run), indexed under the scope
    whose `outage` parked it, if any; False if the lot could not take it."""
    if runtime.state is None:
        return False
    try:
        lot = runtime.state.lot(lot_name(task.app))
        message = capture_message(signature)
        done_ttl = runtime.config.deferral.max_defer_age_s
        ending = guard.ending if guard is not None else None
        runtime.run(lot.park(entry, delay, message, done_ttl, ending, outage))
    except Exception:
        logger.warning("parking task %s failed; deferring by countdown", task.request.id)
        return False
    try:
        start_release_loop(task.app)  # this process releases what is due, too
    except Exception:
        logger.warning("starting the release loop failed", exc_info=True)
    return True


def _announce(
    task: Task[Any, Any],
    runtime: WorkerRuntime,
    reason: str,
    scope: str | None,
    estimate: float,
    count: int,
    now: float,
    delay: float,
    strategy: str,
) -> None:
    """Tell monitoring (telemetry hooks, the signal, a Celery event); never fails the task."""
    due_at = now + delay
    fields = _deferral_fields(reason, scope, estimate, count, due_at, strategy)
    if runtime.telemetry.active:
        runtime.telemetry.emit(DeferralEvent(scope, reason, count, delay, strategy, estimate))
    task_deferred.send(sender=task, task_id=task.request.id, **fields)
    try:
        task.send_event("task-deferred", retry=False, **fields)
        # Then as a retry, which monitors (Flower) show until the task's next run starts.
        reason_text = f"deferred ({reason}) until {time.strftime('%H:%M:%S', time.gmtime(due_at))}"
        task.send_event(
            "task-retried",
            retry=False,
            exception=reason_text,
            traceback="",
            **fields,
        )
    except Exception:
        logger.warning("sending task %s's deferral event failed", task.request.id, exc_info=True)


def _deferral_fields(
    reason: str, scope: str | None, estimate: float, count: int, due_at: float, strategy: str
) -> dict[str, Any]:
    """What a deferral says of itself: in the task's DEFERRED state, its event, its signal."""
    return {
        "reason": reason,
        "scope": scope,
        "retry_after_s": estimate,
        "deferrals": count,
        "due_at": due_at,
        "strategy": strategy,
    }


def _record_deferred(
    task: Task[Any, Any],
    reason: str,
    scope: str | None,
    estimate: float,
    count: int,
    due_at: float,
    strategy: str,
) -> None:
    """Show the task as deferred, before its next run can record anything newer."""
    meta = _deferral_fields(reason, scope, estimate, count, due_at, strategy)
    try:
        task.update_state(state=DEFERRED, meta=meta)
    except Exception:
        logger.warning("recording task %s as deferred failed", task.request.id, exc_info=True)
