"""Governance layer: one attempt carried out against the store and its source.

The engine decides what an attempt is charged and what its settlement records;
these functions do the I/O: hold the permit's lease while the payload is sent
(a slow first token is cut only where another source could serve, rule 17),
settle it at the store (a paid result is never discarded because its
bookkeeping failed, rule 14), and give the permit back after an attempt that did
not finish (a cancellation passes through, rule 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

from polygate_celery.core.breaker import Effect
from polygate_celery.core.engine import Send, Settle
from polygate_celery.core.outcome import Outcome, OutcomeKind
from polygate_celery.core.standing import PLAIN, Standing
from polygate_celery.governance.first_token import another_could_serve
from polygate_celery.governance.plan import ScopePlan
from polygate_celery.sources.base import FirstTokenSource
from polygate_celery.store.base import Grant, Settlement
from polygate_celery.telemetry import SourceAlertEvent

if TYPE_CHECKING:
    from polygate_celery.governance.loop import Runtime

logger = logging.getLogger("polygate_celery")


def lease_for(
    rt: Runtime, plan: ScopePlan, grant: Grant, asked_at: float
) -> AbstractContextManager[object]:
    """The permit's lease, renewed while the attempt runs (raises if the grant came too
    late); nothing to hold for a store whose permits do not expire."""
    if grant.lease_s is None:
        return contextlib.nullcontext()
    return rt.leases.hold(plan.terms[grant.source], grant, asked_at)


async def send(rt: Runtime, plan: ScopePlan, payload: Any, action: Send) -> Outcome:
    """Send the payload to the action's source; a slow first token is cut only where
    another source could serve the call (SPEC §3 rule 17, `governance.first_token`)."""
    adapter = rt.sources[action.source]
    if action.source in rt.first_token:
        limiting = cast(FirstTokenSource, adapter)  # checked once, by the runtime
        if limiting.limits_first_token(payload):
            cut = await another_could_serve(rt.store, plan, action.source, action.excluded)
            return await limiting.send(payload, timeout_s=action.timeout_s, first_token_limit=cut)
    return await adapter.send(payload, timeout_s=action.timeout_s)


async def settle(
    rt: Runtime,
    plan: ScopePlan,
    grant: Grant,
    action: Settle,
    est_tokens: int,
    rank: int | None = None,
    standing: Standing = PLAIN,
) -> bool:
    """Record the attempt (a success as progress of the call's class `rank` too, where
    classes are declared); whether its permit was still held (True when unknown: the
    store failed to record a success, which is logged here)."""
    settlement = Settlement(
        scope=plan.name,
        source=plan.terms[grant.source],
        permit_id=grant.permit_id,
        admitted_at=grant.admitted_at,
        effect=action.effect,
        congested=action.congested,
        pause_s=action.pause_s,
        est_tokens=est_tokens,
        used_tokens=action.used_tokens,
        limits=action.outcome.limits,
        error=action.error,
        rank=rank,
        standing=standing,
    )
    if action.effect is Effect.AUTH_FAILURE:
        _alert_credentials(rt, plan, grant.source)
    try:
        return await rt.store.settle(settlement)
    except Exception:
        if action.outcome.kind is not OutcomeKind.SUCCESS:
            raise
        # A paid result is never discarded because its bookkeeping failed.
        logger.error(
            "scope %r: recording a success of source %r failed; result returned",
            plan.name,
            grant.source,
            exc_info=True,
        )
        return True


async def release(
    rt: Runtime, plan: ScopePlan, grant: Grant, est_tokens: int, standing: Standing = PLAIN
) -> None:
    """Give the permit back after an attempt that did not finish (e.g. cancelled): its
    estimate is refunded, to the quotas and to its tenant (`standing`) alike."""
    terms, permit, admitted_at = plan.terms[grant.source], grant.permit_id, grant.admitted_at
    settlement = Settlement(
        plan.name,
        terms,
        permit,
        admitted_at,
        Effect.NEUTRAL,
        est_tokens=est_tokens,
        standing=standing,
    )
    released = asyncio.ensure_future(rt.store.settle(settlement))
    try:
        # Shielded: a cancellation arriving now must not interrupt the release
        # itself (it goes on in the background), and it still passes through.
        await asyncio.shield(released)
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.warning(
            "scope %r: releasing a permit of %r failed; it returns when its lease expires",
            plan.name,
            grant.source,
            exc_info=True,
        )


def warn_lapsed(plan: ScopePlan, source: str, outcome: Outcome, why: str) -> None:
    """An attempt outlived its permit's lease (SPEC §3 rule 14): its answer is kept,
    a success returned, but the source may have run more than its cap meanwhile."""
    logger.warning(
        "scope %r: the permit lease at source %r lapsed during its attempt (%s); "
        "its answer (%s) is kept, and the source may have run more calls than its "
        "cap meanwhile",
        plan.name,
        source,
        why,
        outcome.kind.value,
    )


def _alert_credentials(rt: Runtime, plan: ScopePlan, source: str) -> None:
    pause = plan.terms[source].breaker.auth_cooldown_s
    logger.error("source %r rejected its credentials; breaker open for %gs", source, pause)
    rt.telemetry.emit(SourceAlertEvent(source, "credentials rejected", pause))
