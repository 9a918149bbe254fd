"""Celery edge: the Celery state on Redis, under the governance store's prefix, one Lua
script per operation (`polygate_celery/celery/lua/`, each headed by its keys).

A lot is four keys (``parked:<lot>`` and its ``:msg``, ``:claim``, ``:dead``), plus an
index per scope whose outage parked entries; a run is three (``run:``, ``done:`` and
``redeliveries:<run>``). Run markers are set from a task's own thread on a blocking
client (no hop to the event loop), and kept alive from the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from polygate_celery.celery.state.base import (
    Begun,
    Counted,
    EndMode,
    Lot,
    MarkerTerms,
    ParkedEntry,
    RunStart,
    Verdict,
)
from polygate_celery.store.redis import KeySpace, LuaScript, lua_text, run_script, translated

_PACKAGE = "polygate_celery.celery"


def _scripts(*names: str) -> dict[str, LuaScript]:
    return {name: LuaScript(lua_text(_PACKAGE, name)) for name in names}


_LOT = _scripts("park", "claim", "confirm", "bury", "unpublished", "wake")
_RUN = _scripts("execution", "heartbeat")


def run_keys(base: str, run: str) -> list[str]:
    """The keys of run `run` (`RunIdentity.key`): its marker, its end, its redeliveries."""
    return [f"{base}:run:{run}", f"{base}:done:{run}", f"{base}:redeliveries:{run}"]


class ParkingLot(Lot):
    """One lot on Redis (four keys under the store's prefix)."""

    def __init__(self, client: Redis, keys: KeySpace, name: str = "default") -> None:
        self.client = client
        self.base = keys.base
        self.name = name
        lot = keys.parked(name)
        self.keys = [lot, f"{lot}:msg", f"{lot}:claim"]
        self.dead = f"{lot}:dead"

    async def _park(self, entry: ParkedEntry) -> None:
        keys = list(self.keys)
        if entry.ending is not None:
            marker, done, _ = run_keys(self.base, entry.ending[0])
            keys += [done, marker]
        if entry.scope is not None:
            keys.append(self.scope_index(entry.scope))
        args = [entry.entry_id, repr(entry.due_in_s), entry.text, repr(entry.done_ttl_s)]
        args += [entry.ending[1] if entry.ending else "", "1" if entry.scope is not None else "0"]
        await run_script(_LOT["park"], self.client, keys, args)

    def scope_index(self, scope: str) -> str:
        """The index of the entries an outage of `scope` parked (entry id -> due time)."""
        return f"{self.keys[0]}:scope:{scope}"

    async def wake(self, scope: str, probe_interval_s: float | None = None) -> int:
        index = self.scope_index(scope)
        mode = ["all"] if probe_interval_s is None else ["probe", repr(probe_interval_s)]
        keys = [*self.keys, index, f"{index}:probe"]
        return int(await run_script(_LOT["wake"], self.client, keys, mode))

    async def _claim(self, limit: int, lease_s: float, token: str) -> Sequence[tuple[str, Any]]:
        reply = await run_script(
            _LOT["claim"], self.client, self.keys, [limit, repr(lease_s), token]
        )
        return [(_str(raw_id), text) for raw_id, text in zip(reply[::2], reply[1::2], strict=True)]

    async def _bury(self, entry_id: str, token: str, why: str) -> bool:
        keys = [*self.keys, self.dead]
        return bool(int(await run_script(_LOT["bury"], self.client, keys, [entry_id, token, why])))

    async def _unpublished(self, entry_id: str, token: str, allowed: int, why: str) -> Counted:
        args: list[str | int] = [entry_id, token, allowed, why]
        keys = [*self.keys, self.dead]
        failed, buried = await run_script(_LOT["unpublished"], self.client, keys, args)
        return int(failed), bool(int(buried))

    async def confirm_all(self, entry_ids: list[str], token: str, keep_s: float) -> list[bool]:
        reply = await run_script(
            _LOT["confirm"], self.client, self.keys, [token, repr(keep_s), *entry_ids]
        )
        return [bool(int(flag)) for flag in reply]

    async def size(self) -> int:
        with translated():
            return int(await self.client.zcard(self.keys[0]))

    async def dead_letters(self) -> dict[str, str]:
        with translated():
            found = await self.client.hgetall(self.dead)
        return {_str(k): _str(v) for k, v in found.items()}


class RedisRunMarkers:
    """Run markers on Redis: `begin` and `end` on the blocking client `blocking()` gives
    (made on first use by the runtime), `beat` on the async client."""

    def __init__(self, client: Redis, keys: KeySpace, blocking: Callable[[], Any]) -> None:
        self.client = client
        self.keys = keys
        self._blocking = blocking

    def begin(self, start: RunStart) -> Begun:
        keys = run_keys(self.keys.base, start.run)
        args = [*self._args("begin", start.token, start.terms, start.copy), repr(start.began_at)]
        if start.lot is not None:
            lot = self.keys.parked(start.lot)
            keys += [lot, f"{lot}:msg"]  # the entry this run was released from, if any
            args.append(start.run)
        reply = self._step(keys, args)
        verdict: Verdict = _str(reply[0])  # type: ignore[assignment]
        if verdict == "running":
            return Begun(verdict, wait_s=max(0.0, int(reply[1]) / 1000))
        began = float(_str(reply[1])) if verdict == "go" and len(reply) > 1 else None
        return Begun(verdict, began_at=began)

    def end(self, run: str, token: str, mode: EndMode, terms: MarkerTerms) -> None:
        self._step(run_keys(self.keys.base, run), self._args(mode, token, terms, False))

    async def beat(self, live: Mapping[str, str], run_ttl_s: float) -> int:
        markers = [run_keys(self.keys.base, run)[0] for run in live]
        args: list[str | int] = [int(run_ttl_s * 1000), *live.values()]
        return int(await run_script(_RUN["heartbeat"], self.client, markers, args))

    @staticmethod
    def _args(mode: str, token: str, terms: MarkerTerms, copy: bool) -> list[str | int]:
        ttls: list[str | int] = [int(terms.run_ttl_s * 1000), repr(terms.done_ttl_s)]
        return [mode, token, *ttls, int(copy), terms.cap]

    def _step(self, keys: list[str], args: list[str | int]) -> Any:
        """One execution.lua step, from the task's own thread (no hop to the loop)."""
        return _RUN["execution"].run_blocking(self._blocking(), keys, args)


class RedisCeleryState:
    """The Celery state under the governance store's prefix (`keys`), on its client."""

    def __init__(self, client: Redis, keys: KeySpace, blocking: Callable[[], Any]) -> None:
        self.client = client
        self.keys = keys
        self._markers = RedisRunMarkers(client, keys, blocking)

    @property
    def markers(self) -> RedisRunMarkers:
        return self._markers

    def lot(self, name: str) -> ParkingLot:
        return ParkingLot(self.client, self.keys, name)


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
