"""A store that keeps what the loop asks of it, for tests that read each admission
and settlement, and a source that answers as told."""

from __future__ import annotations

from polygate_celery import GovernanceBackendError, MemoryStore, Outcome
from polygate_celery.store import AdmitRequest, Denial, Grant, Settlement
from polygate_celery.testing import VirtualClock


class RecordingStore(MemoryStore):
    """The in-memory store, keeping each request it is asked (`asked`), each admission it
    grants and each settlement; its settlements can be made to fail."""

    def __init__(self, clock: VirtualClock, settle_fails: bool = False) -> None:
        super().__init__(clock)
        self.settle_fails = settle_fails
        self.asked: list[AdmitRequest] = []
        self.requests: list[AdmitRequest] = []
        self.grants: list[Grant] = []
        self.settlements: list[Settlement] = []

    async def admit(self, request: AdmitRequest) -> Grant | Denial:
        self.asked.append(request)
        admission = await super().admit(request)
        if isinstance(admission, Grant):
            self.requests.append(request)
            self.grants.append(admission)
        return admission

    async def settle(self, settlement: Settlement) -> bool:
        self.settlements.append(settlement)
        if self.settle_fails:
            raise GovernanceBackendError("connection refused")
        return await super().settle(settlement)


class Answers:
    """A source that gives `outcomes` in turn, the last one for ever after."""

    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes)

    async def send(self, payload: object, *, timeout_s: float) -> Outcome:
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
