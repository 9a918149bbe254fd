"""Governance layer: the driver of the one loop every governed call runs (SPEC §3).

The decisions are the engine's (`core.engine`): a frozen `CallState` and
`next_action(state, event, now)`. `GovernedCall` only carries each action out
against the store, the source and the clock, and answers with what it met. Two
clocks, never mixed: `now` is the local monotonic clock (`Runtime.clock`, or an
injected one), read here and passed in; the scope's progress age comes from the
store's clock as a duration. Chat, embedding and OCR differ only by their
`KindPolicy`. Per call:

* the engine splits the call's time between the retry budget (attempts
  that burn `max_attempts`) and the stall budget (everything else, including a
  429 exempt from the retry budget);
* the stall verdict (`AllSourcesExhausted("stalled")`) needs both this call's
  stall time and the scope's progress age (store clock) past `stall_window_s`;
  it is checked at every poll for a runnable source and, for exempt policies,
  at the top of every iteration;
* `max_call_s` is a hard deadline: every wait and every attempt is cut to it.

Which budget a failure burns (rule 15: an outage is waiting) is decided in
`core.engine.attempts`; the overshoot bound of a `stalled` verdict (rule 13) is
derived in `core.engine.rules`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from polygate_celery.clock import Clock, within
from polygate_celery.core import engine
from polygate_celery.core.backoff import jitter
from polygate_celery.core.outcome import AttemptRecord, Outcome
from polygate_celery.core.standing import PLAIN, Standing, arrival_at, named_for
from polygate_celery.core.terms import SourceTerms
from polygate_celery.errors import AllSourcesExhausted, GovernanceBackendError, SourceFatalError
from polygate_celery.governance import attempts, verdicts
from polygate_celery.governance.lease import Lease, LeaseRenewer
from polygate_celery.governance.places import Place, PlaceKeeper
from polygate_celery.governance.plan import ScopePlan
from polygate_celery.sources.base import FirstTokenSource, Source
from polygate_celery.store.base import AdmitRequest, BlockReason, Denial, Grant, ReleaseWatch, Store
from polygate_celery.telemetry import AttemptEvent, CallEvent, Telemetry, VerdictEvent, WaitEvent


def _new_permit_ids() -> Iterator[str]:
    """Permit ids unique across the fleet (a random prefix per process), cheap per call."""
    prefix = uuid.uuid4().hex[:16]
    return (f"{prefix}-{n}" for n in itertools.count())


_permit_ids = _new_permit_ids()


def _reseed_permit_ids() -> None:
    global _permit_ids  # noqa: PLW0603 - a forked worker must not repeat its parent's ids
    _permit_ids = _new_permit_ids()


os.register_at_fork(after_in_child=_reseed_permit_ids)


@dataclass(frozen=True, slots=True)
class CallResult:
    """A governed call's answer, who served it, what it cost, and how it got there.

    Attributes:
        value: The answer: a `ChatResult`, `EmbeddingResult` or `OcrResult` from
            the HTTP adapters, whatever a custom source returns otherwise.
        source: The source that served it.
        model: The model the provider says answered, if it says.
        prompt_tokens: Input tokens the provider reported, if it did.
        completion_tokens: Output tokens the provider reported, if it did.
        attempts: Every attempt of the call, this success last.
        elapsed_s: The call's duration.
    """

    value: Any
    source: str
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    attempts: tuple[AttemptRecord, ...]
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class Runtime:
    """What every call of one gateway shares."""

    store: Store
    clock: Clock
    random: Callable[[], float]
    telemetry: Telemetry
    sources: Mapping[str, Source]
    leases: LeaseRenewer
    places: PlaceKeeper
    scope_gate: bool = False
    # Priority classes are declared: a call's stall verdict reads its own class's progress.
    classes: bool = False
    # The sources that can limit a first token (`FirstTokenSource`), found once: a
    # runtime-checkable protocol's isinstance costs some 10 µs, on every attempt.
    first_token: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        limits = frozenset(n for n, s in self.sources.items() if isinstance(s, FirstTokenSource))
        object.__setattr__(self, "first_token", limits)


class GovernedCall:
    """One call through the loop. Created per call; its state is never shared. `standing`
    (its class and tenant, resolved once by the gateway) goes with every admission;
    `priority`, its class's name, goes with its events."""

    def __init__(
        self,
        rt: Runtime,
        plan: ScopePlan,
        payload: Any,
        est_tokens: int,
        fail_fast: bool,
        standing: Standing = PLAIN,
        *,
        priority: str | None = None,
    ) -> None:
        self.rt = rt
        self.plan = plan
        self.payload = payload
        self.est_tokens = est_tokens
        self.standing = standing
        self.progress_rank = standing.rank if rt.classes else None
        self.priority = priority
        # named for its tenant, as its permits are: a store's view counts them per tenant
        self.call_id = named_for(next(_permit_ids), standing.tenant)
        # its place in its class on a quota's slots (`AdmitRequest.arrival`), once it has one
        self.arrival: int | None = None
        # and, for a call of a tenant, its fair-queuing tag there (`AdmitRequest.tag`)
        self.tag: float | None = None
        rules = plan.for_call(est_tokens, fail_fast, rt.scope_gate)
        self.state = engine.start(rules, rt.clock.now())
        # What carrying the actions out holds: the round's release watch and places in
        # the candidates' queues, the candidates asked, the grant and its lease.
        self._released: ReleaseWatch | None = None
        self._place: Place | None = None
        self._candidates: tuple[SourceTerms, ...] = plan.candidates
        self._blocked: tuple[tuple[str, BlockReason], ...] = ()  # the round's blockers
        self._grant: Grant | None = None
        self._lease: contextlib.AbstractContextManager[object] | None = None

    async def run(self) -> CallResult:
        if self.rt.telemetry.active:
            kind, tenant = self.plan.policy.kind, self.standing.tenant or None
            self.rt.telemetry.emit(
                CallEvent(self.plan.name, self.call_id, kind, self.payload, self.priority, tenant)
            )
        try:
            result = await self._drive()
        except AllSourcesExhausted as exc:
            stalled = exc.reason == "stalled"
            capped = exc.capped_tenant is not None  # its tenant's caps, not the scope
            if stalled and self.progress_rank is not None and not capped:  # starved?
                exc.starved_class = await verdicts.starved(self.rt, self.plan, self.priority)
            self._emit_verdict(exc.reason, exc.retry_after_s)
            gate = stalled and self.rt.scope_gate and not self.state.gated and not capped
            if gate and exc.starved_class is None:  # an outage
                error = self.state.last_error
                await verdicts.close_gate(self.rt, self.plan, self.call_id, exc, error)
            raise
        except SourceFatalError as exc:
            self._emit_verdict("fatal", None, exc.source)
            raise
        except GovernanceBackendError:
            self._emit_verdict("backend_error", None)
            raise
        except asyncio.CancelledError:
            self._emit_verdict("cancelled", None)
            raise
        except Exception:
            self._emit_verdict("error", None)  # not a verdict of the loop's: a bug, a misuse
            raise
        self._emit_verdict("success", None, result.source)
        return result

    async def _drive(self) -> CallResult:
        """Carry out the engine's actions until one is a verdict."""
        event: engine.Event = engine.Begin()
        now = self.rt.clock.now
        try:
            while True:
                round_ = self.state.round
                self.state, action = engine.next_action(self.state, event, now())
                if self.state.round != round_:
                    self._end_round()
                carry_out = _CARRY_OUT.get(type(action))
                if carry_out is None:
                    return self._verdict(action)
                try:
                    event = await carry_out(self, action)
                except BaseException:
                    self.state = engine.abandon_attempt(self.state, now())
                    raise
        finally:
            self._end_round()

    def _end_round(self) -> None:
        """A round's release watch (and its place in the queues, while it waits there)
        is held until the round ends or its permit is granted; the place ends first."""
        place, released = self._place, self._released
        self._place = self._released = None
        try:
            if place is not None:
                place.__exit__(None, None, None)
        finally:
            if released is not None:
                released.__exit__(None, None, None)

    def _verdict(self, action: engine.Action) -> CallResult:
        """The call's end: its result, or the verdict's exception raised."""
        if isinstance(action, engine.Return):
            return self._result(action.source, action.outcome)
        if isinstance(action, engine.GiveUp):
            raise verdicts.exhausted(self.plan, self.state, action, self.standing.tenant)
        assert isinstance(action, engine.Fail)
        raise verdicts.fatal(self.plan, self.state, action)

    async def _ask_progress(self, action: engine.AskProgress) -> engine.Event:
        rank = self.progress_rank if action.own_class else None
        return engine.ProgressAge(await self.rt.store.progress_age_s(self.plan.name, rank))

    async def _ask_breaker(self, action: engine.AskBreaker) -> engine.Event:
        snapshot = await self.rt.store.snapshot(self.plan.terms[action.source])
        return engine.BreakerState(snapshot.breaker)

    async def _settle(self, action: engine.Settle) -> engine.Event:
        grant = self._grant
        assert grant is not None
        kept = await attempts.settle(
            self.rt, self.plan, grant, action, self.est_tokens, self.progress_rank, self.standing
        )
        self._check_lease(grant, action.outcome, kept)
        return engine.Settled()

    async def _record(self, action: engine.Record) -> engine.Event:
        self._emit_attempt(action.record, action.outcome)
        return engine.Done()

    async def _admit(self, action: engine.Admit) -> engine.Event:
        plan = self.plan
        if action.order is plan.sources:
            self._candidates = plan.candidates
        else:
            self._candidates = tuple(plan.terms[s] for s in action.order)
        # Watch before asking, so a permit released right after the refusal is not missed.
        self._released = self.rt.store.watch_releases(action.order, self.call_id).__enter__()
        admission = await self.rt.store.admit(
            AdmitRequest(
                scope=plan.name,
                candidates=self._candidates,
                permit_id=named_for(next(_permit_ids), self.standing.tenant),
                est_tokens=self.est_tokens,
                gate=self.rt.scope_gate,
                call_id=self.call_id,
                probe_lease_s=plan.max_call_s,
                claim_s=action.claim_s,
                queued=action.queued,
                booked=action.booked,
                book_within_s=action.book_within_s,
                standing=self.standing,
                arrival=self.arrival,
                tag=self.tag,
            )
        )
        if isinstance(admission, Denial):
            self._released.moved()  # (the reply tells its booking: a move told is older)
            self._blocked = admission.blocked
            if self.arrival is None:
                self.arrival = admission.arrival
            if self.tag is None:
                self.tag = admission.tag
            return admission  # a store's `Denial` is the engine's `Refused`
        self._end_round()  # the watch ends with the grant
        self._grant = admission
        if self.arrival is None:
            self.arrival = arrival_at(admission.admitted_at)
        return engine.Granted(admission.source)

    async def _send(self, action: engine.Send) -> engine.Event:
        """Send under the permit's lease; an attempt that does not finish gives its permit
        back (a cancellation passes through, rule 8)."""
        rt, plan, grant = self.rt, self.plan, self._grant
        assert grant is not None
        try:
            self._lease = attempts.lease_for(rt, plan, grant, action.asked_at)
            with self._lease:
                return engine.Sent(await attempts.send(rt, plan, self.payload, action))
        except BaseException:
            await attempts.release(rt, plan, grant, self.est_tokens, self.standing)
            raise

    def _check_lease(self, grant: Grant, outcome: Outcome, kept: bool) -> None:
        lapsed = self._lease.lapsed if isinstance(self._lease, Lease) else None
        if lapsed is None and not kept and grant.lease_s is not None:
            lapsed = "settling found it released"
        if lapsed is not None:
            attempts.warn_lapsed(self.plan, grant.source, outcome, lapsed)

    async def _wait(self, action: engine.Wait) -> engine.Waited:
        """Sleep the action's delay (cut to its cap); a poll also ends when a permit is
        released (or `place` is lost)."""
        rt, released, place = self.rt, self._released, self._place
        if action.queue and place is None:
            hold = rt.places.hold(self._candidates, self.call_id, self.plan.claim_s)
            self._place = place = hold.__enter__()
        delay = action.seconds * jitter(rt.random()) if action.jittered else action.seconds
        started = rt.clock.now()
        delay = min(delay, action.cap_s)
        woken = False
        if delay > 0:
            if action.cause == "no_runnable" and released is not None:
                awaited = released.wait() if place is None else place.lost_or(released.wait())
                woken, _ = await within(rt.clock, delay, awaited)
            else:
                await rt.clock.sleep(delay)
            if rt.telemetry.active:
                rt.telemetry.emit(
                    WaitEvent(
                        scope=self.plan.name,
                        cause=action.cause,
                        started_s=started - self.state.entered_at,
                        seconds=rt.clock.now() - started,
                        blocked=self._blocked if action.cause == "no_runnable" else (),
                        call_id=self.call_id,
                    )
                )
        moved_in_s = released.moved() if released is not None else None
        lost = place is not None and place.lost.is_set()
        return engine.Waited(woken and moved_in_s is None, lost, moved_in_s)

    def _emit_attempt(self, record: AttemptRecord, outcome: Outcome) -> None:
        if self.rt.telemetry.active:
            self.rt.telemetry.emit(
                AttemptEvent(
                    self.plan.name,
                    len(self.state.trail),
                    record,
                    call_id=self.call_id,
                    model=self.plan.models.get(record.source),
                    server=self.plan.servers.get(record.source),
                    outcome=outcome,
                )
            )

    def _result(self, source: str, outcome: Outcome) -> CallResult:
        return CallResult(
            value=outcome.value,
            source=source,
            model=outcome.model or self.plan.models.get(source),
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            attempts=self.state.trail,
            elapsed_s=self.state.elapsed_s(self.rt.clock.now()),
        )

    def _emit_verdict(
        self, verdict: str, retry_after_s: float | None, source: str | None = None
    ) -> None:
        if self.rt.telemetry.active:
            now = self.rt.clock.now()
            self.rt.telemetry.emit(
                VerdictEvent(
                    scope=self.plan.name,
                    verdict=verdict,
                    attempts=len(self.state.trail),
                    elapsed_s=self.state.elapsed_s(now),
                    stalled_s=self.state.stalled_s(now),
                    retry_after_s=retry_after_s,
                    source=source,
                    call_id=self.call_id,
                    priority=self.priority,
                    tenant=self.standing.tenant or None,
                )
            )


# How the driver carries out each action that is not a verdict (`GovernedCall._verdict`).
_CARRY_OUT: dict[type, Callable[[GovernedCall, Any], Awaitable[engine.Event]]] = {
    engine.AskProgress: GovernedCall._ask_progress,
    engine.AskBreaker: GovernedCall._ask_breaker,
    engine.Admit: GovernedCall._admit,
    engine.Send: GovernedCall._send,
    engine.Settle: GovernedCall._settle,
    engine.Record: GovernedCall._record,
    engine.Wait: GovernedCall._wait,
}
