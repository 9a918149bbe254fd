"""Governance layer: a call's verdicts as the exceptions it raises, and the scope gate a
stalled verdict closes (SPEC §3 rules 7 and 16, §4)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from polygate_celery.core.engine import CallState, Fail, GiveUp
from polygate_celery.errors import AllSourcesExhausted, SourceFatalError
from polygate_celery.governance.plan import ScopePlan

if TYPE_CHECKING:
    from polygate_celery.governance.loop import Runtime

logger = logging.getLogger("polygate_celery")


def exhausted(
    plan: ScopePlan, state: CallState, verdict: GiveUp, tenant: str = ""
) -> AllSourcesExhausted:
    """The verdict's exception; `tenant`, the call's (named where its caps stalled it)."""
    return AllSourcesExhausted(
        verdict.reason,
        plan.name,
        verdict.retry_after_s,
        attempts=len(state.trail),
        last_error=state.last_error,
        trail=state.trail,
        rate_limited=verdict.rate_limited,
        capped_tenant=tenant if verdict.capped else None,
    )


def fatal(plan: ScopePlan, state: CallState, verdict: Fail) -> SourceFatalError:
    return SourceFatalError(verdict.reason, plan.name, verdict.source, verdict.status, state.trail)


async def starved(rt: Runtime, plan: ScopePlan, priority: str | None) -> str | None:
    """`priority`, if a call of that class judged stalled on its class's progress was
    starved by other classes: the scope made progress within its stall window (SPEC
    §8); else None. Starved, it is no outage: the scope's gate stays open to the
    others, and a deferred task waits for its class (`AllSourcesExhausted.starved_class`).
    Not known (the store failing): None."""
    try:
        served = await rt.store.progress_age_s(plan.name) < plan.stall_window_s
    except Exception:
        logger.debug("scope %r: its progress could not be read", plan.name, exc_info=True)
        return None
    return priority if served else None


async def close_gate(
    rt: Runtime,
    plan: ScopePlan,
    call_id: str,
    exc: AllSourcesExhausted,
    error: str | None,
) -> None:
    """Close the scope's gate; the call that closed an open one says so, once fleet-wide."""
    seconds = exc.retry_after_s
    try:
        closed = await rt.store.close_gate(
            plan.name, seconds, exc.rate_limited, call_id, error=error
        )
    except Exception:
        logger.warning("scope %r: closing its gate failed", plan.name, exc_info=True)
        return
    if closed:
        logger.warning(
            "scope %r stalled (last error: %s): gate closed, its tasks park, one probe "
            "at a time for up to %.0f s",
            plan.name,
            error or "none",
            seconds,
        )
