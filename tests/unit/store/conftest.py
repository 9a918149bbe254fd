"""The Store contract's fixtures: one parametrized factory per implementation.

Every contract test runs once per store (the root conftest's parametrized
`store` fixture). A store is built on a `VirtualClock` (its clock), and the tests
move time only with `VirtualClock.advance()`; they use nothing but the protocol's
methods, so a new implementation joins by adding a parameter there.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.standing import PLAIN, Standing, arrival_at
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store import (
    AdmitRequest,
    Denial,
    Grant,
    Settlement,
    SourceSnapshot,
    Store,
)
from polygate_celery.store.releases import Watch
from polygate_celery.testing import VirtualClock


class Harness:
    """Protocol calls in one line each, with fresh permit ids by default; a waiter gives
    the arrival its first grant or booking told it, and a tenant's call the tag its first
    booking told it, as the governance loop does."""

    def __init__(self, store: Store, clock: VirtualClock) -> None:
        self.store = store
        self.clock = clock
        self._ids = itertools.count(1)
        self.arrivals: dict[str, int] = {}  # waiter -> its arrival (`AdmitRequest.arrival`)
        self.tags: dict[str, float] = {}  # waiter -> its tag on a quota (`AdmitRequest.tag`)

    def new_id(self) -> str:
        return f"permit-{next(self._ids)}"

    async def admit(
        self,
        *candidates: SourceTerms,
        scope: str = "s",
        permit_id: str | None = None,
        est_tokens: int = 0,
        waiter: str = "",
        claim_s: float = 3.0,
        book_within_s: float = 0.0,
        standing: Standing = PLAIN,
    ) -> Grant | Denial:
        """Admit; `waiter` (a call id) waits if refused: it queues, claiming `claim_s`, and
        books a quota's slot up to `book_within_s` ahead, at its arrival."""
        request = AdmitRequest(
            scope,
            candidates,
            permit_id or self.new_id(),
            est_tokens,
            call_id=waiter,
            claim_s=claim_s if waiter else 0.0,
            book_within_s=book_within_s,
            standing=standing,
            arrival=self.arrivals.get(waiter) if waiter else None,
            tag=self.tags.get(waiter) if waiter else None,
        )
        answer = await self.store.admit(request)
        if waiter and waiter not in self.arrivals:
            if isinstance(answer, Grant):
                self.arrivals[waiter] = arrival_at(answer.admitted_at)
            elif answer.arrival is not None:
                self.arrivals[waiter] = answer.arrival
        if (
            waiter
            and waiter not in self.tags
            and isinstance(answer, Denial)
            and answer.tag is not None
        ):
            self.tags[waiter] = answer.tag
        return answer

    async def grant(self, *candidates: SourceTerms, **kwargs: object) -> Grant:
        result = await self.admit(*candidates, **kwargs)  # type: ignore[arg-type]
        assert isinstance(result, Grant), result
        return result

    async def deny(self, *candidates: SourceTerms, **kwargs: object) -> Denial:
        result = await self.admit(*candidates, **kwargs)  # type: ignore[arg-type]
        assert isinstance(result, Denial), result
        return result

    async def settle(
        self,
        grant: Grant,
        source: SourceTerms,
        effect: Effect = Effect.SUCCESS,
        *,
        scope: str = "s",
        congested: bool = False,
        pause_s: float | None = None,
        est_tokens: int = 0,
        used_tokens: int = 0,
        limits: RateLimits | None = None,
        rank: int | None = None,
        standing: Standing = PLAIN,
    ) -> bool:
        assert grant.source == source.name
        settlement = Settlement(
            scope=scope,
            source=source,
            permit_id=grant.permit_id,
            admitted_at=grant.admitted_at,
            effect=effect,
            congested=congested,
            pause_s=pause_s,
            est_tokens=est_tokens,
            used_tokens=used_tokens,
            limits=limits,
            rank=rank,
            standing=standing,
        )
        return await self.store.settle(settlement)

    async def snapshot(self, source: SourceTerms) -> SourceSnapshot:
        return await self.store.snapshot(source)

    async def listening(self) -> None:
        """Until the store hears the messages its fleet sends this process (one of a fleet
        subscribes when a caller here first waits; a message sent before is not heard)."""
        listening = getattr(self.store, "listening", None)
        if listening is not None:
            await asyncio.wait_for(listening(), timeout=10)

    @staticmethod
    async def told(watch: Watch) -> float:
        """The seconds until the slot `watch`'s call was told its booking moved to
        (`Watch.moved`): at once for a store of one process, by a message for a fleet's."""
        await asyncio.wait_for(watch.wait(), timeout=10)
        in_s = watch.moved()
        assert in_s is not None, f"{watch.call_id} was woken, not told its slot moved"
        return in_s

    @staticmethod
    async def turns(n: int = 10) -> None:
        """Let every other task run for `n` event-loop turns."""
        for _ in range(n):
            await asyncio.sleep(0)


@pytest.fixture
def h(store: Store, clock: VirtualClock) -> Harness:
    return Harness(store, clock)
