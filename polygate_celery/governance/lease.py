"""Governance layer: keeping a permit's lease alive while its attempt runs.

A permit from the Redis store is a lease: if its holder dies, it comes back
after `lease_s`. A live holder renews it every third of the lease. A holder
that can no longer guarantee its lease (its last successful renewal, plus the
lease, minus a safety margin, has passed on its local clock) cancels its own
attempt rather than run unfenced past a lease another worker may already have
been given; the call then fails closed with `GovernanceBackendError`.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from polygate_celery.clock import Clock
from polygate_celery.core.terms import SourceTerms
from polygate_celery.errors import GovernanceBackendError
from polygate_celery.governance.timing import within
from polygate_celery.store.base import Grant, Store

logger = logging.getLogger("polygate_celery")


class LeaseKeeper:
    """Renews `grant`'s lease while the enclosed attempt runs; see the module docstring."""

    def __init__(self, store: Store, clock: Clock, source: SourceTerms, grant: Grant) -> None:
        assert grant.lease_s is not None
        self._store = store
        self._clock = clock
        self._source = source
        self._grant = grant
        self.lease_s = grant.lease_s
        self.renew_every_s = self.lease_s / 3
        self.margin_s = self.lease_s / 6
        # The lease began at admission, before this point: counting from here
        # minus the margin is conservative.
        self.valid_until = clock.now() + self.lease_s - self.margin_s
        self.lost: str | None = None
        self._owner: asyncio.Task[object] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._cancelling = 0

    async def __aenter__(self) -> LeaseKeeper:
        self._owner = asyncio.current_task()
        assert self._owner is not None
        self._cancelling = self._owner.cancelling()
        self._keeper = asyncio.ensure_future(self._keep())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._keeper is not None
        assert self._owner is not None
        self._keeper.cancel()
        if (
            self.lost is not None
            and exc_type is asyncio.CancelledError
            and self._owner.uncancel() <= self._cancelling
        ):
            raise GovernanceBackendError(f"attempt at {self._source.name!r} stopped: {self.lost}")

    async def _keep(self) -> None:
        while True:
            await self._clock.sleep(min(self.renew_every_s, self.valid_until - self._clock.now()))
            if self._clock.now() >= self.valid_until:
                return self._lose("its permit lease could not be renewed in time")
            sent = self._clock.now()
            renewal = self._store.renew(self._source, self._grant.permit_id, self.lease_s)
            try:
                finished, held = await within(self._clock, self.valid_until - sent, renewal)
            except GovernanceBackendError:
                logger.warning("renewing a permit lease of %r failed", self._source.name)
                continue  # try again, until the lease can no longer be guaranteed
            if not finished:
                return self._lose("its permit lease could not be renewed in time")
            if not held:
                return self._lose("its permit lease was reclaimed")
            self.valid_until = sent + self.lease_s - self.margin_s

    def _lose(self, why: str) -> None:
        self.lost = why
        logger.error("attempt at %r cancelled: %s", self._source.name, why)
        assert self._owner is not None
        self._owner.cancel()
