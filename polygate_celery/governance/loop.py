"""Governance layer: the one loop every governed call runs, whatever its kind (SPEC §3).

Chat, embedding and OCR differ only by their `KindPolicy`. Per call:

* a `StallClock` splits the call's time between the retry budget (attempts
  that burn `max_attempts`) and the stall budget (everything else, including a
  429 exempt from the retry budget);
* the stall verdict (`AllSourcesExhausted("stalled")`) needs both this call's
  stall time and the scope's progress age (store clock) past `stall_window_s`;
  it is checked at every poll for a runnable source and, for exempt policies,
  at the top of every iteration;
* `max_call_s` is a hard deadline: every wait and every attempt is cut to it.

An outage is waiting, not the request's failure (SPEC §3 rule 15). A
transient failure burns the retry budget when the scope made progress
since the call's previous failure (since it began, for its first): another
call was served meanwhile, so the failure is this request's own. Otherwise
nothing tells it from an outage of the scope's sources, and in a governed
task, which parks, it is charged to waiting (a direct caller, which cannot
park, charges it so only while the source's breaker is open; else it burns
the retry budget: `ScopePlan.outage_charge`). Charged to waiting,
`max_attempts` is not touched, its time is refunded to the stall budget
unless it is the call's first failure (a single failed attempt, timeout or
not, never makes a stall verdict, rule 5), and the stall verdict is checked
after its backoff. So an outage that outlasts the stall window
ends calls `stalled` (their tasks defer) however many are in flight, a call
already in flight when it begins being charged at most one more failure,
while the breaker keeps the outage's traffic to about one probe per
cooldown; a lone request that can never succeed defers until the deferral
budget ends it. The backoff grows on the call's failures of both kinds; an
exempt 429's grows on the rate-limited streak's own counter (rule 3).

Overshoot bound (SPEC §3 rule 13). Let t* be the first instant at which both
stall conditions hold while the call is in a non-productive step. Checkpoints
sit at the end of every non-productive step for exempt policies (top of the
loop, and every poll); otherwise at every poll and after the backoff of a
failure charged to waiting, so the verdict arrives by the end of the step
that contains t*:

* a poll for a runnable source: at most ``poll_interval_s`` (jitter ≤ 1.0);
* a backoff: at most ``backoff_max_s``;
* a refunded attempt (an exempt 429, an outage's failure) and its backoff: at
  most the source's ``timeout_s`` plus ``backoff_max_s``.

Hence ``t_verdict - t* <= max(poll_interval_s, max_timeout_s + backoff_max_s)``,
where for non-exempt policies t* is counted only inside a checked step.
`tests/property` checks this bound on random scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

from polygate_celery.clock import Clock, within
from polygate_celery.core.backoff import backoff_delay, jitter
from polygate_celery.core.breaker import Effect, effect_of
from polygate_celery.core.outcome import AttemptRecord, Outcome, OutcomeKind
from polygate_celery.core.selection import preference_order
from polygate_celery.core.stall import StallClock, is_stalled
from polygate_celery.core.terms import SourceTerms
from polygate_celery.errors import (
    AllSourcesExhausted,
    ExhaustedReason,
    GovernanceBackendError,
    SourceFatalError,
)
from polygate_celery.governance.first_token import another_could_serve
from polygate_celery.governance.lease import Lease, LeaseRenewer
from polygate_celery.governance.places import Place, PlaceKeeper
from polygate_celery.governance.plan import ScopePlan
from polygate_celery.sources.base import FirstTokenSource, Source
from polygate_celery.store.base import (
    AdmitRequest,
    BlockReason,
    Denial,
    Grant,
    ReleaseWatch,
    Settlement,
    Store,
)
from polygate_celery.telemetry import (
    AttemptEvent,
    CallEvent,
    SourceAlertEvent,
    Telemetry,
    VerdictEvent,
    WaitEvent,
)

logger = logging.getLogger("polygate_celery")
# Blockers whose end is when a rate limit resets: a provider's Retry-After, a quota.
RATE_LIMIT_BLOCKS: frozenset[BlockReason] = frozenset({"paused", "quota"})


def _new_permit_ids() -> Iterator[str]:
    """Permit ids unique across the fleet (a random prefix per process), cheap per call."""
    prefix = uuid.uuid4().hex[:16]
    return (f"{prefix}-{n}" for n in itertools.count())


_permit_ids = _new_permit_ids()


def _reseed_permit_ids() -> None:
    global _permit_ids  # noqa: PLW0603 - a forked worker must not repeat its parent's ids
    _permit_ids = _new_permit_ids()


os.register_at_fork(after_in_child=_reseed_permit_ids)


def _error_text(outcome: Outcome) -> str:
    """A failed attempt as its log lines and verdicts name it: ``transient (HTTP 503):
    upstream error`` (kind, status, classified reason; never a body or a key)."""
    status = f" (HTTP {outcome.status})" if outcome.status is not None else ""
    reason = f": {outcome.reason}" if outcome.reason else ""
    return f"{outcome.kind.value}{status}{reason}"


def _same_source_worth_retrying(outcome: Outcome) -> bool:
    """A 5xx (or 408/409) or a connection error: often gone on the next try. A timeout
    (a silent route) or a malformed answer moves to another source at once."""
    if outcome.timed_out:
        return False
    if outcome.status is None:
        return True  # refused, reset, closed: no answer at all
    return outcome.status >= 500 or outcome.status in (408, 409)


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


class GovernedCall:
    """One call through the loop. Created per call; its state is never shared."""

    def __init__(
        self, rt: Runtime, plan: ScopePlan, payload: Any, est_tokens: int, fail_fast: bool
    ) -> None:
        self.rt = rt
        self.plan = plan
        self.payload = payload
        self.est_tokens = est_tokens
        self.fail_fast = fail_fast
        self.clock = StallClock(rt.clock.now)
        self.deadline = self.clock.entered_at + plan.max_call_s
        self.fails = 0  # failures charged to the retry budget
        self.outage_fails = 0  # transient failures charged to waiting (rule 15)
        self.failed_at: float | None = None  # when this call's latest failure ended
        self.rate_limited_streak = 0  # consecutive 429s exempt from the retry budget
        self.same_tries: dict[str, int] = {}  # retries of a source right after its failure
        self.stay_on: str | None = None  # the source the next attempt retries first
        self.hold_on: tuple[str, float] | None = None  # a short Retry-After waited out on it
        self.trail: list[AttemptRecord] = []
        self.excluded: set[str] = set()
        self.last_failure: dict[str, int] = {}
        self.reopen_at: float | None = None
        self.reopen_is_reset = False  # reopen_at is when rate limits reset, not a guess
        self.last_error: str | None = None
        self.fleet_error = False  # last_error is the fleet's evidence, not this call's own
        self.call_id = next(_permit_ids)
        self.gated = False
        self.refused = False  # refused since its last grant: it may be in a store's queue
        self.booked = False  # told since its last grant that it booked a quota's slot

    async def run(self) -> CallResult:
        if self.rt.telemetry.active:
            kind = self.plan.policy.kind
            self.rt.telemetry.emit(CallEvent(self.plan.name, self.call_id, kind, self.payload))
        try:
            result = await self._loop()
        except AllSourcesExhausted as exc:
            self._emit_verdict(exc.reason, exc.retry_after_s)
            if exc.reason == "stalled" and self.rt.scope_gate and not self.gated:
                await self._close_gate(exc.retry_after_s, exc.rate_limited)
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

    async def _loop(self) -> CallResult:
        plan = self.plan
        while True:
            if plan.policy.rate_limit_exempt:
                await self._raise_if_stalled()
            asked_at = self.rt.clock.now()  # the lease cannot start earlier
            if asked_at >= self.deadline:
                raise self._exhausted("deadline")
            order = self._order()
            if order is plan.sources:
                candidates = plan.candidates
            else:
                candidates = tuple(plan.terms[s] for s in order)
            # Watch before asking, so a permit released right after the refusal is not missed.
            with self.rt.store.watch_releases(order, self.call_id) as released:
                admission = await self.rt.store.admit(
                    AdmitRequest(
                        scope=plan.name,
                        candidates=candidates,
                        permit_id=next(_permit_ids),
                        est_tokens=self.est_tokens,
                        gate=self.rt.scope_gate,
                        call_id=self.call_id,
                        probe_lease_s=plan.max_call_s,
                        claim_s=0.0 if self.fail_fast else plan.claim_s,
                        queued=self.refused,
                        booked=self.booked,
                        book_within_s=self._booking_horizon_s(asked_at),
                    )
                )
                if isinstance(admission, Denial):
                    self.refused = True
                    self.booked = self.booked or admission.booked_in_s is not None
                    if admission.errors:
                        self._note_fleet_error(admission.errors)
                    if admission.gated_for_s is not None:
                        self._refused_by_gate(
                            admission.gated_for_s, admission.gated_reset, admission.gated_error
                        )
                    await self._on_no_runnable(admission, released, candidates)
                    continue
            self.stay_on = self.hold_on = None  # one attempt each
            self.refused = self.booked = False
            outcome, charged = await self._attempt(admission, asked_at)
            if outcome.kind is OutcomeKind.SUCCESS:
                return self._result(admission.source, outcome)
            self._judge_failure(admission.source, outcome, charged)
            self._plan_next(admission.source, outcome)
            if self.fails >= plan.max_attempts:
                raise self._exhausted("retry_exhausted")
            delay = self._backoff(outcome, charged)
            if not charged and outcome.kind is OutcomeKind.TRANSIENT:
                delay = self._outage_backoff(delay)
            # A cut first token is a failover trigger: the next source at once (rule 17).
            await self._wait("backoff", 0.0 if outcome.first_token_cut else delay)
            if not charged and not plan.policy.rate_limit_exempt:
                await self._raise_if_stalled()  # an outage is waiting (rule 15)

    def _order(self) -> Sequence[str]:
        """The sources to ask for, best first (SPEC §5 "Failover discipline"): while a
        short Retry-After of the first source runs, that source alone (the wait goes
        through the no-runnable path); a source just failed by a 5xx or a connection
        error first, once; otherwise configuration order, failed sources last."""
        if self.hold_on is not None:
            source, until = self.hold_on
            # Past the hint by one poll at most: the store's clock may end the pause a
            # little later than this call's.
            if self.rt.clock.now() < until + self.plan.poll_interval_s:
                return [source]
            self.hold_on = None
        if not self.excluded and not self.last_failure and self.stay_on is None:
            return self.plan.sources  # what preference_order gives: configuration order
        return preference_order(self.plan.sources, self.excluded, self.last_failure, self.stay_on)

    def _plan_next(self, source: str, outcome: Outcome) -> None:
        """Where the attempt after this failure goes: back to `source` once after a 5xx
        or a connection error; onto `source` again after its own short Retry-After if it
        is the scope's first choice; elsewhere for anything else."""
        if outcome.kind is OutcomeKind.TRANSIENT and _same_source_worth_retrying(outcome):
            tries = self.same_tries.get(source, 0)
            if tries < self.plan.same_source_retries:
                self.same_tries[source] = tries + 1
                self.stay_on = source
        elif outcome.kind is OutcomeKind.RATE_LIMITED:
            hint = self._sane_hint(outcome.retry_after_s)
            first = next((s for s in self.plan.sources if s not in self.excluded), None)
            short = hint is not None and hint <= self.plan.wait_out_retry_after_s
            if short and source == first and not self.fail_fast:  # fail_fast: never wait
                assert hint is not None
                self.hold_on = (source, self.rt.clock.now() + hint)

    # -- waiting -----------------------------------------------------------------

    async def _on_no_runnable(
        self, denial: Denial, released: ReleaseWatch, candidates: Sequence[SourceTerms]
    ) -> None:
        reopen_in_s = self._sane_hint(denial.reopen_in_s)
        self.reopen_at = None if reopen_in_s is None else self.rt.clock.now() + reopen_in_s
        self.reopen_is_reset = reopen_in_s is not None and all(
            reason in RATE_LIMIT_BLOCKS for _, reason in denial.blocked
        )
        if self.fail_fast:
            raise self._exhausted("fail_fast")
        await self._raise_if_stalled()
        if self._queued_everywhere(denial, candidates):
            await self._wait_in_queue(denial, released, candidates)
            return
        if denial.booked_in_s is not None:  # a quota's slot is booked: ask again then
            delay = denial.booked_in_s
        else:
            delay = self.plan.poll_interval_s * jitter(self.rt.random())
        await self._wait("no_runnable", delay, released, denial)

    def _queued_everywhere(self, denial: Denial, candidates: Sequence[SourceTerms]) -> bool:
        """Whether the denial put this call in the queue of every candidate: each refused
        it for capacity alone (see `AdmitRequest.claim_s`)."""
        return (
            self.plan.claim_s > 0
            and denial.gated_for_s is None
            and denial.booked_in_s is None
            and len(denial.blocked) == len(candidates)
            and all(reason == "at_capacity" for _, reason in denial.blocked)
        )

    async def _wait_in_queue(
        self, denial: Denial, released: ReleaseWatch, candidates: Sequence[SourceTerms]
    ) -> None:
        """Wait in the candidates' queues until a release hands this call a permit, or its
        place is lost (`places`): each poll checks only the stall verdict and the deadline,
        and the store is not asked for a permit again meanwhile."""
        with self.rt.places.hold(candidates, self.call_id, self.plan.claim_s) as place:
            while True:
                delay = self.plan.poll_interval_s * jitter(self.rt.random())
                woken = await self._wait("no_runnable", delay, released, denial, place)
                if woken or place.lost.is_set() or self.rt.clock.now() >= self.deadline:
                    return
                await self._raise_if_stalled()

    def _booking_horizon_s(self, now: float) -> float:
        """How far ahead this call may book a quota's slot (`AdmitRequest.book_within_s`):
        one stall window at most, never past its deadline; never when failing fast."""
        if self.fail_fast:
            return 0.0
        return max(0.0, min(self.plan.stall_window_s, self.deadline - now))

    async def _raise_if_stalled(self) -> None:
        stalled_s = self.clock.stalled_s()
        window = self.plan.stall_window_s
        if stalled_s <= window:
            return  # the store is asked only when this call's own budget is spent
        progress_age_s = await self.rt.store.progress_age_s(self.plan.name)
        if is_stalled(stalled_s, progress_age_s, window):
            raise self._exhausted("stalled")

    async def _wait(
        self,
        cause: Literal["no_runnable", "backoff"],
        delay: float,
        released: ReleaseWatch | None = None,
        denial: Denial | None = None,
        place: Place | None = None,
    ) -> bool:
        """Sleep `delay` (cut to the deadline); a poll also ends when a permit is released
        (or `place` is lost). Returns whether it ended before the delay."""
        started = self.rt.clock.now()
        delay = min(delay, self.deadline - started)
        if delay <= 0:
            return False
        woken = False
        if released is not None:
            awaited = released.wait() if place is None else place.lost_or(released.wait())
            woken, _ = await within(self.rt.clock, delay, awaited)
        else:
            await self.rt.clock.sleep(delay)
        if self.rt.telemetry.active:
            self.rt.telemetry.emit(
                WaitEvent(
                    scope=self.plan.name,
                    cause=cause,
                    started_s=started - self.clock.entered_at,
                    seconds=self.rt.clock.now() - started,
                    blocked=denial.blocked if denial else (),
                    call_id=self.call_id,
                )
            )
        return woken

    # -- attempting --------------------------------------------------------------

    async def _attempt(self, grant: Grant, asked_at: float) -> tuple[Outcome, bool]:
        """Send, settle and record one attempt: the productive span of the stall clock.

        Returns the outcome and whether a failure is charged to the retry budget.
        """
        source = grant.source
        started = self.rt.clock.now()
        full_timeout_s = self.plan.timeouts[source]
        timeout_s = min(full_timeout_s, self.deadline - started)
        with self.clock.attempting() as attempt:
            try:
                lease = self._lease(grant, asked_at)  # raises if the grant came too late
                with lease:
                    outcome = await self._send(source, timeout_s)
            except BaseException:
                await self._release(grant)
                raise
            # An attempt the call's deadline cut short says nothing about its source.
            cut_short = (
                outcome.timed_out and not outcome.first_token_cut and timeout_s < full_timeout_s
            )
            held = await self._settle(grant, outcome, cut_short)
            lapsed = lease.lapsed if isinstance(lease, Lease) else None
            if lapsed is None and not held and grant.lease_s is not None:
                lapsed = "settling found it released"
            if lapsed is not None:
                self._warn_lapsed(source, outcome, lapsed)
            charged = outcome.kind is not OutcomeKind.SUCCESS
            if outcome.kind is OutcomeKind.RATE_LIMITED and self.plan.policy.rate_limit_exempt:
                attempt.refund()
                charged = False
            elif outcome.kind is OutcomeKind.TRANSIENT and await self._scope_is_down(source):
                charged = False
                self.outage_fails += 1
                if self.failed_at is not None:  # the call's first failure stays productive
                    attempt.refund()
            if outcome.kind is not OutcomeKind.SUCCESS:
                self.failed_at = self.rt.clock.now()
            self._record(source, outcome, started, charged, productive=not attempt.refunded)
        return outcome, charged

    async def _send(self, source: str, timeout_s: float) -> Outcome:
        """Send the payload to `source`; a slow first token is cut only where another
        source could serve the call (SPEC §3 rule 17, `governance.first_token`)."""
        adapter = self.rt.sources[source]
        if isinstance(adapter, FirstTokenSource) and adapter.limits_first_token(self.payload):
            cut = await another_could_serve(self.rt.store, self.plan, source, self.excluded)
            return await adapter.send(self.payload, timeout_s=timeout_s, first_token_limit=cut)
        return await adapter.send(self.payload, timeout_s=timeout_s)

    async def _scope_is_down(self, source: str) -> bool:
        """Whether a transient failure shows the scope's sources down (SPEC §3 rule 15).

        The scope's progress is the fleet-wide evidence: if no call of the scope
        succeeded since this call's previous failure (since it began, for its
        first), nothing tells this request's failure from an outage. A governed
        task charges it to waiting (the call ends `stalled` and its task defers;
        the deferral budget bounds a request that can never succeed). A direct
        caller cannot park: it charges it to waiting only while `source`'s
        breaker is open, so a scope that never answered ends its call
        `retry_exhausted` within its attempts, not after a stall window. If
        another call succeeded meanwhile, the sources are serving and the failure
        is this request's own: it burns the retry budget. So once an outage
        begins, a call in flight is charged at most one more failure. Progress
        age is a duration on the store's clock, compared with one on the local
        clock.
        """
        charge = self.plan.outage_charge
        if charge == "retry_budget":
            return False
        since = self.failed_at if self.failed_at is not None else self.clock.entered_at
        age = await self.rt.store.progress_age_s(self.plan.name)
        if age < self.rt.clock.now() - since:
            return False
        if charge == "waiting":
            return True
        snapshot = await self.rt.store.snapshot(self.plan.terms[source])
        return snapshot.breaker != "closed"

    def _backoff(self, outcome: Outcome, charged: bool) -> float:
        """The delay after a failure: an exempt 429 grows on the rate-limited streak's
        own counter (reset by any other outcome), anything else on the call's failures."""
        if outcome.kind is OutcomeKind.RATE_LIMITED and not charged:
            self.rate_limited_streak += 1
            n = self.rate_limited_streak
        else:
            self.rate_limited_streak = 0
            n = self.fails + self.outage_fails
        return backoff_delay(n, self.plan.backoff_base_s, self.plan.backoff_max_s, self.rt.random())

    def _outage_backoff(self, delay: float) -> float:
        """Under a scope gate (a governed task, which parks: SPEC §3 rule 16), a backoff
        after a failure charged to waiting ends at most one poll past the end of the
        call's stall budget, so the verdict is not put off by a long backoff: the task
        holds its worker slot about one stall window in an outage, not a window plus a
        backoff of up to `backoff_max_s`."""
        if not self.rt.scope_gate:
            return delay
        remaining = max(0.0, self.plan.stall_window_s - self.clock.stalled_s())
        return min(delay, remaining + self.plan.poll_interval_s)

    def _lease(self, grant: Grant, asked_at: float) -> AbstractContextManager[object]:
        if grant.lease_s is None:
            return contextlib.nullcontext()
        return self.rt.leases.hold(self.plan.terms[grant.source], grant, asked_at)

    def _warn_lapsed(self, source: str, outcome: Outcome, why: str) -> None:
        """An attempt outlived its permit's lease (SPEC §3 rule 14): its answer is kept,
        a success returned, but the source may have run more than its cap meanwhile."""
        logger.warning(
            "scope %r: the permit lease at source %r lapsed during its attempt (%s); "
            "its answer (%s) is kept, and the source may have run more calls than its "
            "cap meanwhile",
            self.plan.name,
            source,
            why,
            outcome.kind.value,
        )

    def _record(
        self, source: str, outcome: Outcome, started: float, burned: bool, *, productive: bool
    ) -> None:
        record = AttemptRecord(
            source=source,
            outcome=outcome.kind.value,
            seconds=self.rt.clock.now() - started,
            started_s=started - self.clock.entered_at,
            status=outcome.status,
            reason=outcome.reason,
            burned_budget=burned,
            productive=productive,
        )
        self.trail.append(record)
        if self.rt.telemetry.active:
            self.rt.telemetry.emit(
                AttemptEvent(
                    self.plan.name,
                    len(self.trail),
                    record,
                    call_id=self.call_id,
                    model=self.plan.models.get(source),
                    server=self.plan.servers.get(source),
                    outcome=outcome,
                )
            )

    async def _settle(self, grant: Grant, outcome: Outcome, cut_short: bool) -> bool:
        """Record the attempt; whether its permit was still held (True when unknown: the
        store failed to record a success, which is logged here)."""
        kind = outcome.kind
        success = kind is OutcomeKind.SUCCESS
        effect = Effect.NEUTRAL if cut_short else effect_of(kind, outcome.credentials_rejected)
        if success:  # a success that reports no usage keeps its estimate
            used = outcome.used_tokens if outcome.used_tokens is not None else self.est_tokens
        else:
            used = 0
        settlement = Settlement(
            scope=self.plan.name,
            source=self.plan.terms[grant.source],
            permit_id=grant.permit_id,
            admitted_at=grant.admitted_at,
            effect=effect,
            congested=not cut_short and (kind is OutcomeKind.RATE_LIMITED or outcome.timed_out),
            pause_s=self._sane_hint(outcome.retry_after_s)
            if kind is OutcomeKind.RATE_LIMITED
            else None,
            est_tokens=self.est_tokens,
            used_tokens=used,
            limits=outcome.limits,
            error=None if success else _error_text(outcome),
        )
        if effect is Effect.AUTH_FAILURE:
            self._alert_credentials(grant.source)
        try:
            return await self.rt.store.settle(settlement)
        except Exception:
            if not success:
                raise
            # A paid result is never discarded because its bookkeeping failed.
            logger.error(
                "scope %r: recording a success of source %r failed; result returned",
                self.plan.name,
                grant.source,
                exc_info=True,
            )
            return True

    async def _release(self, grant: Grant) -> None:
        """Give the permit back after an attempt that did not finish (e.g. cancelled)."""
        settlement = Settlement(
            scope=self.plan.name,
            source=self.plan.terms[grant.source],
            permit_id=grant.permit_id,
            admitted_at=grant.admitted_at,
            effect=Effect.NEUTRAL,
            est_tokens=self.est_tokens,
        )
        release = asyncio.ensure_future(self.rt.store.settle(settlement))
        try:
            # Shielded: a cancellation arriving now must not interrupt the release
            # itself (it goes on in the background), and it still passes through.
            await asyncio.shield(release)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.warning(
                "scope %r: releasing a permit of %r failed; it returns when its lease expires",
                self.plan.name,
                grant.source,
                exc_info=True,
            )

    def _alert_credentials(self, source: str) -> None:
        pause = self.plan.terms[source].breaker.auth_cooldown_s
        logger.error("source %r rejected its credentials; breaker open for %gs", source, pause)
        self.rt.telemetry.emit(SourceAlertEvent(source, "credentials rejected", pause))

    # -- verdicts ----------------------------------------------------------------

    def _note_fleet_error(self, errors: Sequence[tuple[str, str]]) -> None:
        """A call that met no error of its own names the fleet's evidence: the last error
        on record of the best source its breaker or a pause refused it at (the verdict,
        the gate's line, the deferral's line and a spent deferral budget then say what
        the provider did, though this call sent nothing)."""
        if self.last_error is None or self.fleet_error:
            source, error = errors[0]
            self.last_error = f"{source}: {error}"
            self.fleet_error = True

    def _refused_by_gate(self, gated_for_s: float, reset: bool, error: str | None) -> None:
        """The scope was judged stalled and another call is probing it: defer at once,
        naming the closing verdict's last error unless this call met one of its own."""
        self.gated = True
        self.last_error = self.last_error or error
        self.reopen_at = self.rt.clock.now() + gated_for_s
        self.reopen_is_reset = reset
        raise self._exhausted("stalled")

    async def _close_gate(self, seconds: float, reset: bool) -> None:
        """Close the scope's gate; the call that closed an open one says so, once fleet-wide."""
        try:
            closed = await self.rt.store.close_gate(
                self.plan.name, seconds, reset, self.call_id, error=self.last_error
            )
        except Exception:
            logger.warning("scope %r: closing its gate failed", self.plan.name, exc_info=True)
            return
        if closed:
            logger.warning(
                "scope %r stalled (last error: %s): gate closed, its tasks park, one probe "
                "at a time for up to %.0f s",
                self.plan.name,
                self.last_error or "none",
                seconds,
            )

    def _sane_hint(self, seconds: float | None) -> float | None:
        """A provider's or store's reopening hint, if usable: finite, positive, capped."""
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            return None
        return min(seconds, self.plan.retry_after_cap_s)

    def _judge_failure(self, source: str, outcome: Outcome, charged: bool) -> None:
        """Count a failed attempt against the budget, or raise the verdict it settles."""
        self.last_error = f"{source}: {_error_text(outcome)}"
        self.fleet_error = False
        if outcome.kind is OutcomeKind.FATAL:
            raise SourceFatalError(
                outcome.reason or "fatal", self.plan.name, source, outcome.status, self.trail
            )
        if self.rt.clock.now() >= self.deadline:
            raise self._exhausted("deadline")  # e.g. an attempt the deadline cut short
        self.last_failure[source] = len(self.trail)
        if outcome.kind is OutcomeKind.RATE_LIMITED:
            hint = self._sane_hint(outcome.retry_after_s)
            if hint is not None and not self._reopening_known():
                self.reopen_at = self.rt.clock.now() + hint
                self.reopen_is_reset = True
        if not charged:
            return
        self.fails += 1
        if outcome.kind is OutcomeKind.REJECTED:
            self.excluded.add(source)
            if self.excluded.issuperset(self.plan.sources):
                raise SourceFatalError(
                    f"no source left: {outcome.reason or 'rejected'}",
                    self.plan.name,
                    source,
                    outcome.status,
                    self.trail,
                )

    def _reopening_known(self) -> bool:
        return self.reopen_at is not None and self.reopen_at > self.rt.clock.now()

    def _exhausted(self, reason: ExhaustedReason) -> AllSourcesExhausted:
        return AllSourcesExhausted(
            reason,
            self.plan.name,
            self._retry_after_s(),
            attempts=len(self.trail),
            last_error=self.last_error,
            trail=self.trail,
            rate_limited=self.reopen_is_reset and self._reopening_known(),
        )

    def _retry_after_s(self) -> float:
        """Soonest known reopening of the scope, clamped (SPEC §3 rule 7).

        A reopening that has already passed is no longer known: the estimate
        then falls back to `stall_window_s`.
        """
        if self.reopen_at is not None and self._reopening_known():
            estimate = self.reopen_at - self.rt.clock.now()
        else:
            estimate = self.plan.stall_window_s
        return min(max(estimate, self.plan.poll_interval_s), self.plan.retry_after_cap_s)

    def _result(self, source: str, outcome: Outcome) -> CallResult:
        return CallResult(
            value=outcome.value,
            source=source,
            model=outcome.model or self.plan.models.get(source),
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            attempts=tuple(self.trail),
            elapsed_s=self.clock.elapsed_s(),
        )

    def _emit_verdict(
        self, verdict: str, retry_after_s: float | None, source: str | None = None
    ) -> None:
        if self.rt.telemetry.active:
            self.rt.telemetry.emit(
                VerdictEvent(
                    scope=self.plan.name,
                    verdict=verdict,
                    attempts=len(self.trail),
                    elapsed_s=self.clock.elapsed_s(),
                    stalled_s=self.clock.stalled_s(),
                    retry_after_s=retry_after_s,
                    source=source,
                    call_id=self.call_id,
                )
            )
