"""Governance layer: keeping permit leases alive while their attempts run.

A permit from the Redis store is a lease: if its holder dies, it comes back
after `lease_s`. One `LeaseRenewer` per gateway renews every lease its running
attempts hold, in one batched store call every third of the lease, so the cost
does not grow with the number of attempts and an attempt itself costs nothing
more than a dictionary entry. An attempt whose lease can no longer be
guaranteed (its last successful renewal, plus the lease, minus a safety margin
of a sixth, has passed on the local clock) is cancelled rather than left to run
unfenced past a lease another worker may already hold; the call then fails
closed with `GovernanceBackendError`.

That fence works only before the lease lapses. A lease found already gone --
the store says it is no longer held, or the renewer first runs after the
lease's end, because the process was frozen (SIGSTOP, a VM or GC pause) or its
event loop blocked -- fences nothing any more: its permit may be another
call's already, and the request is at the provider, paid for. Its attempt is
then left to finish (within its own timeout) and only marked `lapsed`, so the
answer is kept (SPEC §3 rule 14); the loop logs it and settles what the store
allows. The source's cap can be exceeded by such a request for as long as its
holder was frozen plus the request's remaining time.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from polygate_celery.blocks import EndsWithBlock
from polygate_celery.clock import Clock, within
from polygate_celery.core.terms import SourceTerms
from polygate_celery.errors import GovernanceBackendError
from polygate_celery.governance.renewal import BatchRenewer
from polygate_celery.store.base import Grant, Store

logger = logging.getLogger("polygate_celery")


@dataclass(eq=False, slots=True)
class Lease(EndsWithBlock):
    """One attempt's lease, registered with the renewer while the attempt runs."""

    source: SourceTerms
    permit_id: str
    lease_s: float
    valid_until: float  # past this, the lease is not guaranteed: the attempt is stopped
    lapses_at: float  # past this, the store's lease has ended for sure (local clock)
    owner: asyncio.Task[object]
    cancelling: int
    lost: str | None = field(default=None)  # why the attempt was stopped
    lapsed: str | None = field(default=None)  # why the lease is gone; the attempt runs on
    renewer: LeaseRenewer | None = field(default=None, repr=False)

    def _block_ended(self, exc_type: type[BaseException] | None) -> None:
        assert self.renewer is not None
        self.renewer.release(self)
        if (
            self.lost is not None
            and exc_type is asyncio.CancelledError
            and self.owner.uncancel() <= self.cancelling
        ):
            raise GovernanceBackendError(f"attempt at {self.source.name!r} stopped: {self.lost}")


class LeaseRenewer(BatchRenewer):
    """Renews the leases of one gateway's running attempts; see the module docstring."""

    def __init__(self, store: Store, clock: Clock) -> None:
        super().__init__(store, clock)
        self._leases: dict[str, Lease] = {}
        self._every_s = 0.0  # a third of the latest first lease's length

    def hold(self, source: SourceTerms, grant: Grant, asked_at: float) -> Lease:
        """Keep `grant`'s lease alive while the enclosed attempt runs (a `with` block).

        `asked_at` is the local time the admission was requested: the lease
        cannot have started earlier, so it is counted from there. If the reply
        came so late that the lease is no longer guaranteed, nothing is sent.
        """
        assert grant.lease_s is not None
        owner = asyncio.current_task()
        assert owner is not None
        valid_until = asked_at + grant.lease_s * 5 / 6
        now = self._clock.now()
        if now >= valid_until:
            raise GovernanceBackendError(
                f"the permit at {source.name!r} arrived too late to trust its lease"
            )
        lease = Lease(
            source=source,
            permit_id=grant.permit_id,
            lease_s=grant.lease_s,
            valid_until=valid_until,
            lapses_at=now + grant.lease_s,  # granted before this reply arrived
            owner=owner,
            cancelling=owner.cancelling(),
            renewer=self,
        )
        self._leases[grant.permit_id] = lease
        self._ensure_running()
        if len(self._leases) == 1:
            self._every_s = grant.lease_s / 3
            self._wake.set()  # the renewer waits for a first lease; with others, it runs
        return lease

    def release(self, lease: Lease) -> None:
        self._leases.pop(lease.permit_id, None)

    async def _run(self) -> None:
        while True:
            if not self._leases:
                self._wake.clear()
                await self._wake.wait()
            if self._leases:
                every = min(lease.lease_s for lease in self._leases.values()) / 3
                earliest = min(lease.valid_until for lease in self._leases.values())
                delay = min(every, earliest - self._clock.now())
            else:
                # Woken by a lease whose attempt has ended already (a quick call): the
                # next renewal would be due a third of a lease on, so sleep that long;
                # the quick calls that come and go meanwhile do not wake this task.
                delay = self._every_s
            await self._clock.sleep(delay)
            self._cancel_expired()
            if self._leases:
                await self._renew()

    async def _renew(self) -> None:
        leases = list(self._leases.values())
        sent = self._clock.now()
        budget = min(lease.valid_until for lease in leases) - sent
        renewal = self._store.renew([(x.source, x.permit_id, x.lease_s) for x in leases])
        try:
            finished, held = await within(self._clock, max(budget, 0.0), renewal)
        except Exception:
            logger.warning("renewing %d permit lease(s) failed; retrying", len(leases))
            return
        if not finished or held is None or len(held) != len(leases):
            self._cancel_expired()
            return
        answered = self._clock.now()
        for lease, still_held in zip(leases, held, strict=True):
            if self._leases.get(lease.permit_id) is not lease:
                continue  # its attempt ended (and settled) while the renewal was in flight
            if still_held:
                lease.valid_until = sent + lease.lease_s * 5 / 6
                lease.lapses_at = answered + lease.lease_s
            else:
                self._lapse(lease, "the store no longer held it")

    def _cancel_expired(self) -> None:
        now = self._clock.now()
        for lease in list(self._leases.values()):
            if now >= lease.lapses_at:  # too late to fence: the renewer itself was held up
                self._lapse(lease, "it lapsed while this process was held up")
            elif now >= lease.valid_until:
                self._lose(lease, "its permit lease could not be renewed in time")

    def _lapse(self, lease: Lease, why: str) -> None:
        """A lease already gone: stopping its attempt would end no overlap at the
        source, only throw away a request that is paid for. Mark it; the loop logs it."""
        lease.lapsed = why
        self._leases.pop(lease.permit_id, None)

    def _lose(self, lease: Lease, why: str) -> None:
        if lease.lost is None:
            lease.lost = why
            logger.error("attempt at %r cancelled: %s", lease.source.name, why)
            lease.owner.cancel()
        self._leases.pop(lease.permit_id, None)
