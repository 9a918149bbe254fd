"""Governance layer: waiting calls keep their places in the sources' queues.

A call refused for capacity alone at every candidate waits in each source's queue
(fleet-wide, first come first served) until a release hands it a permit. Its place
lasts as long as its claim. One `PlaceKeeper` per gateway renews the claims of all
its waiting calls in one batched store call every third of a claim, so a waiting
call does not ask for a permit again at each poll: a process with a hundred waiters
costs the store one call per interval, where each waiter's poll cost an admission
(a refused one). A place the store no longer keeps ends the wait and the call asks
again: a permit was handed to it (and the wake-up message was lost), its claim
ended (renewals came too late), or the source is paused or its breaker is not
closed (the admission then says why, and the call polls as usual).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from polygate_celery.blocks import EndsWithBlock
from polygate_celery.clock import Clock, within
from polygate_celery.core.terms import SourceTerms
from polygate_celery.governance.renewal import BatchRenewer
from polygate_celery.store.base import Store

logger = logging.getLogger("polygate_celery")


@dataclass(eq=False, slots=True)
class Place(EndsWithBlock):
    """One waiting call's places (one per candidate), kept while the call waits."""

    sources: tuple[SourceTerms, ...]
    call_id: str
    claim_s: float
    valid_until: float  # local time its claims surely last until
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    keeper: PlaceKeeper | None = field(default=None, repr=False)

    async def lost_or(self, other: Awaitable[object]) -> None:
        """Return once the place is lost or `other` is done (the other is cancelled)."""
        waits = {asyncio.ensure_future(other), asyncio.ensure_future(self.lost.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    def _block_ended(self, exc_type: type[BaseException] | None) -> None:
        assert self.keeper is not None
        self.keeper.leave(self)


class PlaceKeeper(BatchRenewer):
    """Renews the claims of one gateway's waiting calls; see the module docstring."""

    def __init__(self, store: Store, clock: Clock) -> None:
        super().__init__(store, clock)
        self._places: dict[str, Place] = {}

    def hold(self, sources: Sequence[SourceTerms], call_id: str, claim_s: float) -> Place:
        """Keep the places the call `call_id` was just given (its admission was refused for
        capacity alone at every one of `sources`) while the enclosed wait runs."""
        place = Place(tuple(sources), call_id, claim_s, self._clock.now() + claim_s)
        place.keeper = self
        self._places[call_id] = place
        self._ensure_running()
        self._wake.set()
        return place

    def leave(self, place: Place) -> None:
        if self._places.get(place.call_id) is place:
            del self._places[place.call_id]

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            if not self._places:
                await self._wake.wait()
                continue
            # Each place is due a third into its claim; one batch renews them all. A call
            # that comes to wait meanwhile (its claim may be shorter) wakes the keeper to
            # look again.
            due = min(p.valid_until - 2 * p.claim_s / 3 for p in self._places.values())
            wait_s = due - self._clock.now()
            if wait_s > 0:
                woken, _ = await within(self._clock, wait_s, self._wake.wait())
                if woken:
                    continue
            self._drop_expired()
            if self._places:
                await self._keep()

    async def _keep(self) -> None:
        places = list(self._places.values())
        sent = self._clock.now()
        budget = min(p.valid_until for p in places) - sent
        asked = [(terms, p.call_id, p.claim_s) for p in places for terms in p.sources]
        try:
            finished, kept = await within(
                self._clock, max(budget, 0.0), self._store.keep_places(asked)
            )
        except Exception:
            logger.debug("keeping %d waiting call(s) in queue failed", len(places), exc_info=True)
            finished, kept = False, None
        if not finished or kept is None or len(kept) != len(asked):
            for place in places:  # each asks again (and meets the store's state itself)
                self._lose(place)
            return
        at = 0
        for place in places:
            held = all(kept[at : at + len(place.sources)])
            at += len(place.sources)
            if self._places.get(place.call_id) is not place:
                continue  # its wait ended while the renewal was in flight
            if held:
                place.valid_until = sent + place.claim_s
            else:
                self._lose(place)

    def _drop_expired(self) -> None:
        now = self._clock.now()
        for place in list(self._places.values()):
            if now >= place.valid_until:
                self._lose(place)

    def _lose(self, place: Place) -> None:
        place.lost.set()
        self.leave(place)
