"""Store layer (memory): the end of an attempt, as settle.lua records it.

The permit is released; the breaker and the AIMD limit move by `core`'s rules
(`breaker_settle`, `aimd_on_success`, `aimd_on_congestion`: settle.lua mirrors
them, and the store contract suite runs both stores); the pause, the provider's
announced limits, the token accounting and the scope's progress are recorded; a
freed permit goes to the source's first live waiter. The changes an operator must
hear of are logged by the process whose settle made them (`changes`).
"""

from __future__ import annotations

from polygate_celery.clock import Clock
from polygate_celery.core.aimd import aimd_on_congestion, aimd_on_success
from polygate_celery.core.breaker import Effect, breaker_settle
from polygate_celery.core.quota import gcra_settle
from polygate_celery.core.standing import PLAIN, corrected
from polygate_celery.store.base import GATE_KEPT_S, Settlement
from polygate_celery.store.changes import BreakerChange, SettleChanges, log_changes
from polygate_celery.store.memory.state import Ledger, SourceState


def settle(ledger: Ledger, settlement: Settlement, clock: Clock) -> bool:
    """Release the permit and record the attempt (see `Store.settle`); log what changed."""
    state = ledger.source(settlement.source)
    before, paused_until = state.breaker, state.paused_until
    gate = ledger.gates.get(settlement.scope)
    had_gate = gate is not None and gate.until + GATE_KEPT_S > clock.now()
    held = _record(ledger, settlement, clock.now())
    now = clock.now()
    after = state.breaker
    pause = settlement.pause_s
    change: BreakerChange | None = None
    if after.mode == "open" and before.mode != "open":
        change = "opened" if before.mode == "closed" else "reopened"
    elif after.mode == "closed" and before.mode != "closed":
        change = "closed"
    changes = SettleChanges(
        breaker=change,
        open_for_s=after.open_until - now if change in ("opened", "reopened") else 0.0,
        paused_for_s=pause if pause is not None and pause > 0 and paused_until <= now else None,
        gate_opened=had_gate and settlement.scope not in ledger.gates,
    )
    if change in ("opened", "reopened"):
        state.opened_at = now
    if changes != _NO_CHANGES:
        log_changes(settlement, changes)
    return held


_NO_CHANGES = SettleChanges()


def _record(ledger: Ledger, settlement: Settlement, now: float) -> bool:
    """Record the attempt at `now`; whether its permit was held."""
    terms = settlement.source
    state = ledger.source(terms)
    # Facts safe to record twice are kept even for a permit no longer held (its
    # lease lapsed while the answer came): the pause, the announcements, and what a
    # success shows (the source serves: breaker closed, AIMD increase, progress).
    # A failure's breaker count and AIMD decrease, and the token settlement, belong
    # to the permit's own accounting.
    paused = settlement.pause_s is not None and settlement.pause_s > 0
    if paused:
        assert settlement.pause_s is not None
        state.paused_until = max(state.paused_until, now + settlement.pause_s)
    held = settlement.permit_id in state.permits
    # The source's last error (as settle.lua keeps it): what it said as a pause began,
    # or a held permit's failure; a success while no pause runs ends it.
    failed = held and settlement.effect in (Effect.FAILURE, Effect.AUTH_FAILURE)
    if settlement.error and (paused or failed):
        state.error = settlement.error
    elif settlement.effect is Effect.SUCCESS and state.paused_until <= now:
        state.error = None
    if held:  # the estimate first, then the announcement (a floor on what is spent)
        state.learned.settle_tokens(
            now, settlement.admitted_at, settlement.est_tokens, settlement.used_tokens
        )
    if settlement.limits is not None:
        state.learned.learn(now, settlement.limits)
    if settlement.effect is Effect.SUCCESS:
        ledger.progress[settlement.scope] = now
        if settlement.rank is not None:
            ledger.progress[settlement.scope, settlement.rank] = now
        ledger.gates.pop(settlement.scope, None)  # the scope is alive: open its gate
    if not held and settlement.effect is not Effect.SUCCESS:
        return False
    if held and settlement.standing is not PLAIN:  # the tenant's share counts tokens used
        _correct(state, settlement)
    if held:
        state.fair.sweep()
        state.quota_fair.sweep()
    state.breaker = breaker_settle(
        state.breaker, terms.breaker, now, settlement.permit_id, settlement.effect
    )
    assert state.aimd is not None
    if settlement.effect is Effect.SUCCESS:
        state.aimd = aimd_on_success(state.aimd, terms.aimd, terms.max_concurrency)
        if not held:
            return False
    elif settlement.congested:
        state.aimd = aimd_on_congestion(state.aimd, terms.aimd, settlement.admitted_at, now)
    state.permits.discard(settlement.permit_id)
    _release_tenant(state, settlement, now)
    quota = terms.quota
    if quota is not None and quota.tpm is not None and settlement.est_tokens > 0:
        quota_state = ledger.quota(quota.name)
        quota_state.token_tat = gcra_settle(
            quota_state.token_tat, settlement.est_tokens, settlement.used_tokens, quota.tpm
        )
    breaker = state.breaker
    runnable = breaker.mode != "open" and breaker.probe is None and state.paused_until <= now
    if runnable and state.in_use(now) < ledger.limit(state, terms):
        ledger.hand_on(terms.name, state, now)
    return True


def _release_tenant(state: SourceState, settlement: Settlement, now: float) -> None:
    """A call of a tenant with caps: one fewer in flight, its tokens counted as used (as
    settle.lua); tenants idle long enough are forgotten."""
    caps = settlement.standing.caps
    hold = state.tenants.get(settlement.standing.tenant) if caps is not None else None
    if caps is None or hold is None:
        return
    hold.permits.discard(settlement.permit_id)
    if caps.tpm and settlement.est_tokens > 0:
        hold.token_tat = gcra_settle(
            hold.token_tat, settlement.est_tokens, settlement.used_tokens, caps.tpm
        )
    state.forget_idle_tenants(now)


def _correct(state: SourceState, settlement: Settlement) -> None:
    """The tenant's last tags, in the permits' queue and on the quota, moved by the tokens
    used against the estimate (as settle.lua)."""
    standing = settlement.standing
    key = (standing.rank, standing.tenant)
    for fair in (state.fair, state.quota_fair):
        finish = fair.finish.get(key)
        if finish is not None:
            virtual = fair.virtual.get(standing.rank, 0.0)
            fair.finish[key] = corrected(
                finish, virtual, settlement.est_tokens, settlement.used_tokens, standing.weight
            )
