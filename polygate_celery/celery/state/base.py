"""Celery edge: the Celery state's protocol: parking lots and run markers, and what both
implementations share.

The Celery edge keeps two things of its own beside the governance store: the
parking lot where deferred task messages wait until due (`Lot`), and the run
markers that let one run of a message go on at a time (`RunMarkers`). Each is a
small set of atomic operations; `state.redis` implements them with Lua scripts
(the fleet's state), `state.memory` in a process's memory (unit tests; the same
contract suite runs on both). The rounds written on top of the lot's operations
(decoding and checking a claimed entry, burying one Celery cannot take) live
once, in `Lot`.

Times: a lot's due times and the markers' lifetimes are the implementation's
own clock (Redis ``TIME``, or the memory state's injected clock); the time a
run began (`RunMarkers.begin`'s `began_at`) is the worker's wall clock, epoch
seconds, compared with the result backend's ``date_done``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from polygate_celery.celery.parked_message import malformed

logger = logging.getLogger("polygate_celery")
Verdict = Literal["go", "done", "running", "poison"]
EndMode = Literal["finish", "release", "handback"]
RunEnding = tuple[str, str]
"""(run key, token) of a deferring run that parking its message ends in the same step."""
Counted = tuple[int, bool]
"""A failed release counted: (failures so far, whether the entry was buried now)."""


@dataclass(frozen=True, slots=True)
class MarkerTerms:
    """How long run markers live: a live run's marker without a beat (`run_ttl_s`), a
    finished run's record (`done_ttl_s`), and how many copies of a run that died may run
    (`cap`)."""

    run_ttl_s: float
    done_ttl_s: float
    cap: int


@dataclass(frozen=True, slots=True)
class Begun:
    """What `RunMarkers.begin` found. ``go``: this run is the live one (`began_at`: an
    earlier run of the message began then and never finished, so its outcome may be
    stored); ``done``: the message's outcome is final; ``running``: another run's marker
    is alive for `wait_s` more; ``poison``: the message's runs died too often."""

    verdict: Verdict
    wait_s: float = 0.0
    began_at: float | None = None


@dataclass(frozen=True, slots=True)
class RunStart:
    """A run about to begin: its key (`RunIdentity.key`) and token, whether it is a `copy`
    (a redelivery, a held-back copy: counted toward `terms.cap`), the worker's wall time
    (`began_at`), and the `lot` it may have been released from (its entries that
    started this run are forgotten as it begins)."""

    run: str
    token: str
    copy: bool
    terms: MarkerTerms
    began_at: float
    lot: str | None = None


@dataclass(frozen=True, slots=True)
class ParkedEntry:
    """An entry to park: `text` (the message, as JSON) due in `due_in_s` (at least 0);
    `ending`, a deferring run to mark finished (for `done_ttl_s`) in the same step;
    `scope`, the scope whose outage parked it (`Lot.wake`)."""

    entry_id: str
    due_in_s: float
    text: str
    done_ttl_s: float
    ending: RunEnding | None
    scope: str | None


class RunMarkers(Protocol):
    """One live run per task message, told apart by token."""

    def begin(self, start: RunStart) -> Begun:
        """Mark the run live under its token, unless its outcome is final or another run
        of it is alive; a copy counts toward the cap."""
        ...

    def end(self, run: str, token: str, mode: EndMode, terms: MarkerTerms) -> None:
        """``finish``: the outcome is final, copies are dropped; ``release``: the run ended
        but its message goes on, and the next copy is not counted toward the cap;
        ``handback``: the same, counted. The marker is dropped if `token` holds it."""
        ...

    async def beat(self, live: Mapping[str, str], run_ttl_s: float) -> int:
        """Keep each run of `live` (run -> token) alive for `run_ttl_s` more, setting a lapsed
        marker again. Returns how many markers another run had taken (left alone)."""
        ...


class CeleryState(Protocol):
    """The Celery edge's state: lots by name, and the run markers, sharing one store (a
    deferral parks its message and ends its run in one step)."""

    @property
    def markers(self) -> RunMarkers: ...

    def lot(self, name: str) -> Lot: ...


class Lot(ABC):
    """A parking lot: entries (id -> a task message, as JSON) by due time, claimed with a
    lease by a releaser (its token), confirmed once published, buried to dead letters.

    Its rounds are written here once, over the atomic operations each implementation
    provides (the abstract methods)."""

    name: str
    dead: str  # where buried entries go, as the log names it

    @abstractmethod
    async def _park(self, entry: ParkedEntry) -> None:
        """Park `entry` (parking it again voids a claim on its old message)."""

    @abstractmethod
    async def wake(self, scope: str, probe_interval_s: float | None = None) -> int:
        """Make the entries an outage of `scope` parked due now (the scope answers again:
        the release loop publishes them, and the scope's permits and quotas pace their
        runs); with `probe_interval_s`, only the earliest, and only if it would come back
        later than that and no probe was woken within that long (while every task of
        the scope is parked, one comes back as its probe about once per interval).
        Returns how many became due."""

    @abstractmethod
    async def _claim(self, limit: int, lease_s: float, token: str) -> Sequence[tuple[str, Any]]:
        """Claim due entries: (entry id, its text as stored), in due order."""

    @abstractmethod
    async def _bury(self, entry_id: str, token: str, why: str) -> bool:
        """Move a claimed entry to the dead letters; False if `token` lost its claim."""

    @abstractmethod
    async def _unpublished(self, entry_id: str, token: str, allowed: int, why: str) -> Counted:
        """Count a failed release; (failures so far, whether it was buried now)."""

    @abstractmethod
    async def confirm_all(self, entry_ids: list[str], token: str, keep_s: float) -> list[bool]:
        """The entries' messages are published: keep each `keep_s` more seconds (twice as
        long per earlier release, at most 32 times; its run forgets it when it begins),
        or forget them now (0). Per entry: False if `token` no longer held its claim."""

    @abstractmethod
    async def size(self) -> int:
        """Entries parked, due or not."""

    @abstractmethod
    async def dead_letters(self) -> dict[str, str]:
        """Entry id -> why it was buried, a newline, then the whole entry."""

    async def park(
        self,
        entry_id: str,
        due_in_s: float,
        message: dict[str, Any],
        done_ttl_s: float,
        ending: RunEnding | None = None,
        scope: str | None = None,
    ) -> None:
        """Park `message` as `entry_id` (the run it starts); `ending` = (run, token) of a
        deferring run, marked finished in the same step. With `scope` (the scope whose
        outage parked it), the entry is indexed under it: `wake` makes it due at once
        when the scope answers again."""
        text = json.dumps(message)
        await self._park(ParkedEntry(entry_id, max(0.0, due_in_s), text, done_ttl_s, ending, scope))

    async def claim(
        self, limit: int, lease_s: float, token: str
    ) -> list[tuple[str, dict[str, Any]]]:
        """Claim at most `limit` due entries for `lease_s` (due again when it ends): those
        Celery can take, decoded; the others are buried."""
        claimed: list[tuple[str, dict[str, Any]]] = []
        for entry_id, text in await self._claim(limit, lease_s, token):
            why: str | None = "not JSON"
            with contextlib.suppress(ValueError):
                message = json.loads(text)
                why = malformed(message)
            if why is None:
                claimed.append((entry_id, message))
            else:
                await self.bury(entry_id, token, why)
        return claimed

    async def bury(self, entry_id: str, token: str, why: str) -> None:
        """Move a claimed entry that Celery cannot take to the dead letters (the whole
        entry, after why), once; one ERROR line names it and why (never its content)."""
        if await self._bury(entry_id, token, why):
            logger.error(
                "parked entry %s is not a task message (%s): moved to %s", entry_id, why, self.dead
            )

    async def unpublished(self, entry_id: str, token: str, allowed: int, error: str) -> int:
        """Count a release of a claimed entry that failed with an error of no known kind;
        the `allowed`-th such failure buries it (one ERROR line). Returns the count."""
        why = f"publishing it failed {allowed} times ({error})"
        failed, buried = await self._unpublished(entry_id, token, allowed, why)
        if buried:
            logger.error("parked entry %s: %s: moved to %s", entry_id, why, self.dead)
        return failed

    async def confirm(self, entry_id: str, token: str, keep_s: float = 0.0) -> bool:
        """`confirm_all` of one entry."""
        return (await self.confirm_all([entry_id], token, keep_s))[0]


MAX_DOUBLINGS = 5  # a kept entry's keep doubles per release, at most this many times
