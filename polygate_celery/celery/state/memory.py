"""Celery edge: the Celery state in one process's memory, the twin of `state.redis`.

Each operation does what its Lua script does (`polygate_celery/celery/lua/`), under
one lock, on the injected clock (a `VirtualClock` in tests: a lease ends, a marker
lapses, an entry falls due only when the test moves time). The same contract
suite runs on both (``tests/unit/celery``). Nothing is shared between processes:
it serves unit tests of the guard and the lot, not a fleet.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polygate_celery.celery.state import base
from polygate_celery.celery.state.base import Begun, Counted, Lot, ParkedEntry, RunStart
from polygate_celery.clock import Clock, SystemClock

PROBE_INDEX_KEEP_S = 86400.0  # an index entry older than this was released on its own
COPY_ENTRY = ":copy"  # after a run's key: the entry of its held-back copy


@dataclass(slots=True)
class _Expiring:
    value: Any
    until: float = math.inf


@dataclass(slots=True)
class _LotData:
    due: dict[str, float] = field(default_factory=dict)  # entry id -> due time
    msg: dict[str, str] = field(default_factory=dict)  # id, id#released, id#failed
    claim: dict[str, str] = field(default_factory=dict)  # entry id -> releaser token
    dead: dict[str, str] = field(default_factory=dict)
    scopes: dict[str, dict[str, float]] = field(default_factory=dict)  # scope -> id -> due
    probes: dict[str, float] = field(default_factory=dict)  # scope -> probe woken until

    def drop(self, entry_id: str) -> None:
        """Forget an entry whole (its message, counts and claim)."""
        self.due.pop(entry_id, None)
        for name in (entry_id, f"{entry_id}#released", f"{entry_id}#failed"):
            self.msg.pop(name, None)
        self.claim.pop(entry_id, None)

    def entomb(self, entry_id: str, why: str) -> None:
        entry = self.msg.get(entry_id, "")
        self.drop(entry_id)
        self.dead[entry_id] = f"{why}\n{entry}"


class MemoryCeleryState:
    """Lots and run markers in memory, on `clock` (default: the system's)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self.lock = threading.Lock()
        self.lots: dict[str, _LotData] = {}
        self.runs: dict[str, _Expiring] = {}  # run -> its live token
        self.done: dict[str, _Expiring] = {}  # run -> "1" or "b:<began at>"
        self.redeliveries: dict[str, _Expiring] = {}
        self._markers = MemoryRunMarkers(self)

    @property
    def markers(self) -> MemoryRunMarkers:
        return self._markers

    def lot(self, name: str) -> MemoryLot:
        return MemoryLot(self, name)

    def lot_data(self, name: str) -> _LotData:
        return self.lots.setdefault(name, _LotData())

    def get(self, table: dict[str, _Expiring], key: str) -> Any:
        found = table.get(key)
        if found is None or found.until <= self.clock.now():
            table.pop(key, None)
            return None
        return found.value

    def put(self, table: dict[str, _Expiring], key: str, value: Any, ttl_s: float) -> None:
        table[key] = _Expiring(value, self.clock.now() + ttl_s)

    def finish(self, run: str, done_ttl_s: float) -> None:
        self.put(self.done, run, "1", math.ceil(done_ttl_s))

    def drop_marker(self, run: str, token: str) -> None:
        if self.get(self.runs, run) == token:
            del self.runs[run]


class MemoryRunMarkers:
    """Run markers in memory (execution.lua and heartbeat.lua)."""

    def __init__(self, state: MemoryCeleryState) -> None:
        self.state = state

    def begin(self, start: RunStart) -> Begun:
        state, run, terms = self.state, start.run, start.terms
        with state.lock:
            if start.lot is not None and start.lot in state.lots:
                data = state.lots[start.lot]
                for entry in (run, run + COPY_ENTRY):
                    data.due.pop(entry, None)
                    data.msg.pop(entry, None)
                    data.msg.pop(f"{entry}#released", None)
            began = state.get(state.done, run)
            if began is not None and not began.startswith("b:"):
                return Begun("done")
            owner = state.get(state.runs, run)
            if owner is not None and owner != start.token:
                return Begun("running", wait_s=state.runs[run].until - state.clock.now())
            if start.copy:
                times = (state.get(state.redeliveries, run) or 0) + 1
                state.put(state.redeliveries, run, times, math.ceil(terms.done_ttl_s))
                if times > terms.cap:
                    return Begun("poison")
            state.put(state.runs, run, start.token, int(terms.run_ttl_s * 1000) / 1000)
            if began is not None:
                return Begun("go", began_at=float(began[2:]))
            state.put(state.done, run, f"b:{start.began_at!r}", math.ceil(terms.done_ttl_s))
            return Begun("go")

    def end(self, run: str, token: str, mode: base.EndMode, terms: base.MarkerTerms) -> None:
        state = self.state
        with state.lock:
            if mode == "finish":
                state.finish(run, terms.done_ttl_s)
            elif mode == "release":  # handed back, not lost: the next copy is not counted
                times = (state.get(state.redeliveries, run) or 0) - 1
                state.put(state.redeliveries, run, times, math.ceil(terms.done_ttl_s))
            state.drop_marker(run, token)

    async def beat(self, live: Mapping[str, str], run_ttl_s: float) -> int:
        state = self.state
        taken = 0
        with state.lock:
            for run, token in live.items():
                owner = state.get(state.runs, run)
                if owner is None or owner == token:
                    state.put(state.runs, run, token, int(run_ttl_s * 1000) / 1000)
                else:
                    taken += 1
        return taken


class MemoryLot(Lot):
    """One lot in memory (park.lua, claim.lua, confirm.lua, bury.lua, unpublished.lua,
    wake.lua)."""

    def __init__(self, state: MemoryCeleryState, name: str) -> None:
        self.state = state
        self.name = name
        self.dead = f"the dead letters of lot {name!r}"

    async def _park(self, entry: ParkedEntry) -> None:
        with self.state.lock:
            data, now = self._data(), self.state.clock.now()
            data.due[entry.entry_id] = now + entry.due_in_s
            data.msg[entry.entry_id] = entry.text
            data.claim.pop(entry.entry_id, None)
            if entry.scope is not None:
                index = data.scopes.setdefault(entry.scope, {})
                for old in [e for e, due in index.items() if due <= now - PROBE_INDEX_KEEP_S]:
                    del index[old]
                index[entry.entry_id] = now + entry.due_in_s
            if entry.ending is not None:
                self.state.finish(entry.ending[0], entry.done_ttl_s)
                self.state.drop_marker(*entry.ending)

    async def wake(self, scope: str, probe_interval_s: float | None = None) -> int:
        with self.state.lock:
            data, now = self._data(), self.state.clock.now()
            probe = probe_interval_s is not None
            interval = probe_interval_s or 0.0
            if probe and data.probes.get(scope, -math.inf) > now:
                return 0
            index = data.scopes.get(scope, {})
            woken = 0
            for entry_id in sorted(index, key=lambda e: (index[e], e)):
                due = data.due.get(entry_id)
                waiting = (
                    due is not None
                    and due > now
                    and entry_id in data.msg
                    and entry_id not in data.claim
                    and f"{entry_id}#released" not in data.msg
                )
                if not waiting:
                    del index[entry_id]
                    continue
                if probe:
                    assert due is not None
                    if due <= now + interval:
                        return 0
                    data.probes[scope] = now + max(1, math.floor(interval * 1000)) / 1000
                data.due[entry_id] = now
                del index[entry_id]
                woken += 1
                if probe:
                    return 1
            return woken

    async def _claim(self, limit: int, lease_s: float, token: str) -> Sequence[tuple[str, Any]]:
        with self.state.lock:
            data, now = self._data(), self.state.clock.now()
            due = sorted((at, e) for e, at in data.due.items() if at <= now)[:limit]
            out: list[tuple[str, Any]] = []
            for _, entry_id in due:
                message = data.msg.get(entry_id)
                if message is None:
                    data.drop(entry_id)
                    continue
                data.due[entry_id] = now + lease_s
                data.claim[entry_id] = token
                out.append((entry_id, message))
            return out

    async def _bury(self, entry_id: str, token: str, why: str) -> bool:
        with self.state.lock:
            data = self._data()
            if data.claim.get(entry_id) != token:
                return False
            data.entomb(entry_id, why)
            return True

    async def _unpublished(self, entry_id: str, token: str, allowed: int, why: str) -> Counted:
        with self.state.lock:
            data = self._data()
            if data.claim.get(entry_id) != token or entry_id not in data.msg:
                return 0, False
            failed = int(data.msg.get(f"{entry_id}#failed", "0")) + 1
            data.msg[f"{entry_id}#failed"] = str(failed)
            if failed < allowed:
                return failed, False
            data.entomb(entry_id, why)
            return failed, True

    async def confirm_all(self, entry_ids: list[str], token: str, keep_s: float) -> list[bool]:
        with self.state.lock:
            data, now = self._data(), self.state.clock.now()
            return [self._confirm(data, entry_id, token, keep_s, now) for entry_id in entry_ids]

    @staticmethod
    def _confirm(data: _LotData, entry_id: str, token: str, keep_s: float, now: float) -> bool:
        if data.claim.get(entry_id) != token:
            return False
        del data.claim[entry_id]
        data.msg.pop(f"{entry_id}#failed", None)
        if keep_s <= 0:
            data.drop(entry_id)
            return True
        if entry_id not in data.msg:  # its run began already and forgot it
            data.msg.pop(f"{entry_id}#released", None)
            return True
        released = int(data.msg.get(f"{entry_id}#released", "0")) + 1
        data.msg[f"{entry_id}#released"] = str(released)
        data.due[entry_id] = now + keep_s * 2 ** min(released - 1, base.MAX_DOUBLINGS)
        return True

    async def size(self) -> int:
        with self.state.lock:
            return len(self._data().due)

    async def dead_letters(self) -> dict[str, str]:
        with self.state.lock:
            return dict(self._data().dead)

    def _data(self) -> _LotData:
        return self.state.lot_data(self.name)
