"""Store layer (Redis): the fleet-wide governance store, one Lua script per operation.

Every read-modify-write is one script from `lua/` (its SHA computed once,
called with `EVALSHA`, loaded again on ``NOSCRIPT``, e.g. after a ``SCRIPT
FLUSH`` or a failover). A successful attempt
costs two script calls: `admit` and `settle`. Time inside the scripts is Redis
``TIME``, or the injected clock's time passed as an argument.

The client (`connect`: one server, Sentinel or a Cluster) runs without hidden
retries and with explicit timeouts: every connection error or timeout becomes a
`StoreUnreachable`, every script error or malformed reply a `StoreReplyError`
(both `GovernanceBackendError`s, translated in `errors`) at once, so a call
fails closed within the socket timeout, and the same client reconnects when
Redis is back (after a failover, to the new master).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis as sync
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from polygate_celery.clock import Clock, WaitsForIO
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.models import StoreConfig
from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.quota import WINDOW_S, counts_in_windows, gcra_spent, requests_spent
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store.base import (
    AdmitRequest,
    BlockReason,
    Denial,
    Grant,
    QuotaSnapshot,
    Settlement,
    SourceSnapshot,
)
from polygate_celery.store.changes import (
    BreakerChange,
    SettleChanges,
    log_changes,
    log_half_open,
)
from polygate_celery.store.redis.connect import (
    AsyncClient,
    cluster_node_client,
    governance_client,
    redis_client,
)
from polygate_celery.store.redis.errors import bad_reply, reading, translated
from polygate_celery.store.redis.groups import Groups, governance_groups
from polygate_celery.store.redis.keys import KeySpace
from polygate_celery.store.redis.wire import Command, KeptConnections
from polygate_celery.store.releases import ReleaseHub, Watch

logger = logging.getLogger("polygate_celery")

PROGRESS_TTL_S = 3600.0
_COMMANDS_KEPT = 256  # packed admit/settle commands kept per store, each kind
_SCRIPTS = ("admit", "settle", "renew", "keep", "progress", "source", "gate", "quota")
_ANY = translated()  # a script of another layer's: the message is Redis's own
_BREAKER_CHANGES: dict[str, BreakerChange] = {
    "opened": "opened",
    "reopened": "reopened",
    "closed": "closed",
}


def _flags(reply: Any, n: int, name: str, *, followed: bool = False) -> list[bool]:
    """The first `n` items of a script's reply, each 1 or 0, as booleans; the reply holds
    exactly those unless `followed` (more items after them)."""
    with reading(name, reply):
        flags = [int(x) == 1 for x in reply[:n]]
    if len(flags) != n or (not followed and len(reply) != n):
        raise bad_reply(name, reply)
    return flags


def _changes_reply(reply: list[Any], settlement: Settlement) -> Any:
    """Log the state changes settle.lua reported (see its header); its result."""
    with reading("settle", reply):
        result, breaker, open_for, pause, gate = reply
        mode = breaker.decode() if isinstance(breaker, bytes) else str(breaker)
        fresh = pause.decode() if isinstance(pause, bytes) else str(pause)
        changes = SettleChanges(
            breaker=_BREAKER_CHANGES.get(mode),
            open_for_s=float(open_for),
            paused_for_s=float(fresh) if fresh else None,
            gate_opened=gate in (b"1", "1"),
        )
    log_changes(settlement, changes)
    return result


def _fmt(x: float) -> str:
    return repr(float(x))


_NOT_ANNOUNCED = (b"0", b"0")


def _announced(limits: RateLimits | None) -> tuple[bytes, ...]:
    """The provider's announced limits as settle.lua reads them (a limit of 0: none), then
    the requests reset and whether it shows a window (see settle.lua)."""

    def pair(limit: int | None, remaining: int | None) -> tuple[bytes, bytes]:
        if not limit or limit <= 0 or remaining is None:
            return _NOT_ANNOUNCED
        return str(limit).encode(), str(remaining).encode()

    if limits is None:
        return (*_NOT_ANNOUNCED * 2, b"", b"")
    shown = counts_in_windows(
        limits.requests_limit, limits.requests_remaining, limits.requests_reset_s
    )
    window: tuple[bytes, bytes] = (b"", b"")
    if shown is not None and limits.requests_reset_s is not None:
        window = (_fmt(limits.requests_reset_s).encode(), b"1" if shown else b"0")
    return (
        *pair(limits.requests_limit, limits.requests_remaining),
        *pair(limits.tokens_limit, limits.tokens_remaining),
        *window,
    )


class RedisStore:
    """The store protocol on Redis, shared by every worker process of the fleet.

    `clock` is None to use Redis ``TIME`` (production), or an injected clock
    whose time is passed to the scripts (tests in virtual time). `lease_s` is
    the lifetime of a permit that is not renewed: a SIGKILLed holder's permit
    comes back after at most that long. `groups` (a cluster's governance groups,
    `governance_groups`) spread the keys over hash tags; without them every key
    is under the fleet tag.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        prefix: str = "polygate",
        lease_s: float = 30.0,
        clock: Clock | None = None,
        groups: Groups | None = None,
    ) -> None:
        if not lease_s > 0:
            raise ValueError("lease_s must be positive")
        self._client = client
        # A cluster client learns the slot table on first use; concurrent first calls
        # of a cold client each start that, so the first one does it alone (below).
        self._cold = isinstance(client, RedisCluster)
        self._warming = asyncio.Lock() if self._cold else None
        self.keys = KeySpace(prefix, groups or Groups())
        self.lease_s = lease_s
        self._clock = clock
        self._io_hold = clock.waiting_for_io if isinstance(clock, WaitsForIO) else None
        self._scripts = {name: LuaScript(_lua(name)) for name in _SCRIPTS}
        self._translated = {name: translated(name, client) for name in _SCRIPTS}
        self._origin = uuid.uuid4().hex[:12]
        self._lease_arg = _fmt(lease_s).encode()
        self._encodings: dict[SourceTerms, _Encoded] = {}
        # Packed commands, by scope and the identity of the terms (held by the entry, so
        # an id is not reused while it is cached): a dictionary look-up per call.
        self._admit_commands: dict[tuple[object, ...], tuple[tuple[SourceTerms, ...], Command]]
        self._admit_commands = {}
        self._settle_commands: dict[tuple[str, int], tuple[SourceTerms, Command]] = {}
        self._kept = KeptConnections.of(client)
        self._releases = ReleaseHub()
        self._listener: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout_s: float = 2.0,
        connect_timeout_s: float = 2.0,
        **kwargs: Any,
    ) -> RedisStore:
        client = redis_client(
            url, socket_timeout_s=socket_timeout_s, connect_timeout_s=connect_timeout_s
        )
        return cls(client, **kwargs)

    @classmethod
    def from_config(
        cls, config: StoreConfig, *, groups_of: GatewayConfig | None = None, **kwargs: Any
    ) -> RedisStore:
        """The store on the Redis `config` names: one server, Sentinel or a Cluster. On a
        cluster, the governance groups of `groups_of` (the whole configuration) give the
        keys their hash tags (keys.py); elsewhere every key keeps the fleet tag."""
        kwargs.setdefault("prefix", config.key_prefix)
        kwargs.setdefault("lease_s", config.lease_s)
        if config.cluster_nodes is not None and groups_of is not None:
            kwargs.setdefault("groups", governance_groups(groups_of))
        return cls(governance_client(config), **kwargs)

    @property
    def client(self) -> Redis:
        """The client (a `RedisCluster` on a cluster: it takes the same commands)."""
        return self._client  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Stop listening for releases and close the connections."""
        self._closed = True
        if self._kept is not None:
            await self._kept.aclose()
        if self._listener is not None:
            self._listener.cancel()
            # redis-py may swallow a cancellation while it connects; the loop also
            # checks `_closed`, and a listener stuck in I/O is not waited for long.
            await asyncio.wait({self._listener}, timeout=2.0)
            self._listener = None
        await self._client.aclose()

    # -- the protocol --------------------------------------------------------------

    async def admit(self, request: AdmitRequest) -> Grant | Denial:
        waits = b"0"
        if request.claim_s > 0 and request.call_id:
            waits = (b"3" if request.booked else b"2") if request.queued else b"1"
        args = (
            self._now_arg(),
            request.permit_id.encode(),
            str(request.est_tokens).encode(),
            request.call_id.encode(),
            waits,
            _fmt(request.probe_lease_s).encode() if request.gate else b"",
            _fmt(request.claim_s).encode(),
            _fmt(request.book_within_s).encode() if request.book_within_s > 0 else b"",
        )
        reply = await self._send("admit", self._admit_command(request), args)
        with reading("admit", reply):
            kind = int(reply[0])
            if kind in (1, 4):  # 4: the source's half-open probe (turned, open_s, error)
                handed = reply[6:] if kind == 4 else reply[3:]
                for call_id, source in zip(handed[::2], handed[1::2], strict=True):
                    self._releases.wake_call(str(call_id), str(source))  # handed on, here
                if kind == 4 and str(reply[3]) == "1":  # this admission turned it half-open
                    log_half_open(
                        str(reply[1]), float(reply[4]) if reply[4] else None, str(reply[5]) or None
                    )
                return Grant(
                    str(reply[1]),
                    request.permit_id,
                    float(reply[2]),
                    self.lease_s,
                    probe=kind == 4,
                )
            if kind == 2:
                gated = float(reply[1])
                said = str(reply[3]) if len(reply) > 3 else ""
                return Denial(
                    gated,
                    (),
                    gated_for_s=gated,
                    gated_reset=str(reply[2]) == "1",
                    gated_error=said or None,
                )
            if waits != b"0":
                self._listen_for_releases()  # someone here is about to wait
            booked = kind == 3  # then the slot it booked comes next
            named = reply[3:] if booked else reply[2:]
            names, said = named[::3], named[2::3]
            reasons: list[tuple[str, BlockReason]] = [
                (str(name), reason) for name, reason in zip(names, named[1::3], strict=True)
            ]
            errors = tuple((str(name), str(e)) for name, e in zip(names, said, strict=True) if e)
            if waits != b"0" and any(reason == "at_capacity" for _, reason in reasons):
                self._releases.note_queued(request.call_id)
            return Denial(
                float(reply[1]) if reply[1] else None,
                tuple(reasons),
                booked_in_s=float(reply[2]) if booked else None,
                errors=errors,
            )

    async def settle(self, settlement: Settlement) -> bool:
        terms = settlement.source
        pause = settlement.pause_s
        args = (
            self._now_arg(),
            settlement.permit_id.encode(),
            settlement.effect.value.encode(),
            b"1" if settlement.congested else b"0",
            _fmt(pause).encode() if pause is not None and math.isfinite(pause) else b"",
            str(settlement.est_tokens).encode(),
            str(settlement.used_tokens).encode(),
            _fmt(settlement.admitted_at).encode(),
            *_announced(settlement.limits),
            (settlement.error or "").encode(),
        )
        reply = await self._send("settle", self._settle_command(settlement.scope, terms), args)
        if isinstance(reply, list):  # a state change, which this process logs for the fleet
            reply = _changes_reply(reply, settlement)
        if isinstance(reply, str) and reply not in ("0", "1"):
            self._releases.wake_call(reply, terms.name)  # a waiter here: no message
            return True
        released = self._int(reply, "settle") == 1
        if released:  # a watch here of a caller that does not queue, if any
            self._releases.released(terms.name)
        return released

    async def renew(self, leases: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        """One script per hash tag among the leases' keys: one on a single server or behind
        Sentinel, one per governance group on a cluster (a script's keys share a slot)."""
        keys = [self.keys.permits(source.name) for source, _, _ in leases]
        by_tag: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            by_tag.setdefault(key[: key.index("}") + 1], []).append(i)
        held = [False] * len(leases)
        for batch in by_tag.values():
            args: list[str | int | float] = [self._now()]
            for i in batch:
                args += [leases[i][1], _fmt(leases[i][2])]
            reply = await self._run("renew", [keys[i] for i in batch], args)
            for i, answer in zip(batch, _flags(reply, len(batch), "renew"), strict=True):
                held[i] = answer
        return held

    async def keep_places(self, places: Sequence[tuple[SourceTerms, str, float]]) -> list[bool]:
        """One script per hash tag among the places' sources, as `renew`."""
        by_tag: dict[str, dict[SourceTerms, list[int]]] = {}
        for i, (terms, _, _) in enumerate(places):
            permits = self.keys.permits(terms.name)
            tag = by_tag.setdefault(permits[: permits.index("}") + 1], {})
            tag.setdefault(terms, []).append(i)
        kept = [False] * len(places)
        for sources in by_tag.values():
            keys: list[str] = []
            args: list[str | int | float] = [self._now(), self._origin, self.keys.wake]
            order: list[int] = []
            for terms, indices in sources.items():
                name = terms.name
                keys += [
                    self.keys.permits(name),
                    self.keys.state(name),
                    self.keys.queue(name),
                    self.keys.alive(name),
                ]
                args += [name, terms.max_concurrency, terms.aimd.initial_limit or 0, len(indices)]
                for i in indices:
                    args += [places[i][1], _fmt(places[i][2])]
                order += indices
            reply = await self._run("keep", keys, args)
            flags = _flags(reply, len(order), "keep", followed=True)
            woken = reply[len(order) :]
            if len(woken) % 2:
                raise bad_reply("keep", reply)
            for call_id, source in zip(woken[::2], woken[1::2], strict=True):
                self._releases.wake_call(str(call_id), str(source))
            for i, flag in zip(order, flags, strict=True):
                kept[i] = flag
        return kept

    async def progress_age_s(self, scope: str) -> float:
        reply = await self._run(
            "progress", [self.keys.progress(scope)], [self._now(), "age", _fmt(PROGRESS_TTL_S)]
        )
        with reading("progress", reply):
            return math.inf if reply == "" else float(reply)

    async def mark_progress(self, scope: str) -> None:
        await self._run(
            "progress", [self.keys.progress(scope)], [self._now(), "mark", _fmt(PROGRESS_TTL_S)]
        )

    async def close_gate(
        self,
        scope: str,
        seconds: float,
        reset: bool = False,
        call_id: str = "",
        error: str | None = None,
    ) -> bool:
        closing = ["close", _fmt(seconds), "1" if reset else "0", call_id, error or ""]
        return str(await self._run("gate", [self.keys.gate(scope)], [self._now(), *closing])) == "1"

    async def gate_closed_for_s(self, scope: str) -> float:
        reply = await self._run("gate", [self.keys.gate(scope)], [self._now(), "read"])
        with reading("gate", reply):
            return float(reply)

    async def pause_source(self, source: str, seconds: float) -> None:
        keys = [self.keys.permits(source), self.keys.state(source)]
        await self._run("source", keys, [self._now(), "pause", _fmt(seconds)])

    async def resume_source(self, source: str) -> None:
        keys = [self.keys.permits(source), self.keys.state(source)]
        await self._run("source", keys, [self._now(), "resume"])

    async def reset_source(self, source: str) -> None:
        keys = [self.keys.permits(source), self.keys.state(source)]
        await self._run("source", keys, [self._now(), "reset"])

    async def quota_snapshot(self, quota: QuotaTerms) -> QuotaSnapshot:
        keys = [self.keys.quota(quota.name), self.keys.quota_log(quota.name)]
        reply = await self._run("quota", keys, [self._now(), _fmt(WINDOW_S)])
        with reading("quota", reply):
            request_ahead_s, token_ahead_s, in_window = (float(x) for x in reply)
        return QuotaSnapshot(
            name=quota.name,
            requests_used=requests_spent(
                quota.rpm, quota.rpm_window, int(in_window), request_ahead_s, 0.0
            ),
            tokens_used=None if quota.tpm is None else gcra_spent(token_ahead_s, 0.0, quota.tpm),
        )

    def watch_releases(self, sources: Sequence[str], call_id: str = "") -> Watch:
        return self._releases.watch(sources, call_id)

    async def snapshot(self, source: SourceTerms) -> SourceSnapshot:
        keys = [self.keys.permits(source.name), self.keys.state(source.name)]
        args: list[str | int | float] = [
            self._now(),
            "snapshot",
            source.max_concurrency,
            source.aimd.initial_limit or 0,
        ]
        reply = await self._run("source", keys, args)
        with reading("snapshot", reply):
            live, limit, mode, failures, paused_for, learned_rpm, learned_tpm = reply
            return SourceSnapshot(
                name=source.name,
                permits_in_use=int(live),
                permit_limit=int(limit),
                breaker=mode,
                breaker_failures=int(failures),
                paused_for_s=float(paused_for),
                learned_rpm=int(float(learned_rpm)) or None,
                learned_tpm=int(float(learned_tpm)) or None,
            )

    # -- plumbing ------------------------------------------------------------------

    def _encoded(self, terms: SourceTerms) -> _Encoded:
        """A source's keys and packed terms, built once per distinct terms."""
        encoded = self._encodings.get(terms)
        if encoded is None:
            encoded = _Encoded.of(terms, self.keys)
            self._encodings[terms] = encoded
        return encoded

    def _admit_command(self, request: AdmitRequest) -> Command:
        """admit.lua's keys and fixed arguments for this scope and these candidates."""
        candidates = request.candidates
        key = (request.scope, *map(id, candidates))
        cached = self._admit_commands.get(key)
        if cached is not None:
            return cached[1]
        keys: list[bytes] = []
        tail = [self._lease_arg, self._origin.encode(), self.keys.wake.encode()]
        for terms in candidates:
            encoded = self._encoded(terms)
            keys += encoded.keys
            tail += encoded.admit_terms
        keys.append(self.keys.gate(request.scope).encode())
        command = Command(keys, tail)
        if len(self._admit_commands) >= _COMMANDS_KEPT:
            self._admit_commands.clear()  # terms made afresh per call: bounded all the same
        self._admit_commands[key] = (candidates, command)
        return command

    def _settle_command(self, scope: str, terms: SourceTerms) -> Command:
        """settle.lua's keys and fixed arguments for this scope and source."""
        key = (scope, id(terms))
        cached = self._settle_commands.get(key)
        if cached is not None:
            return cached[1]
        encoded = self._encoded(terms)
        permits, state, quota, _, queue, alive = encoded.keys  # not the log: a send is a send
        keys = [
            permits,
            state,
            quota,
            self.keys.progress(scope).encode(),
            self.keys.gate(scope).encode(),
            queue,
            alive,
        ]
        tail = [self._origin.encode(), terms.name.encode(), self.keys.wake.encode()]
        command = Command(keys, [*tail, *encoded.settle_terms])
        if len(self._settle_commands) >= _COMMANDS_KEPT:
            self._settle_commands.clear()
        self._settle_commands[key] = (terms, command)
        return command

    def _now(self) -> str:
        return "" if self._clock is None else _fmt(self._clock.now())

    def _now_arg(self) -> bytes:
        return b"" if self._clock is None else _fmt(self._clock.now()).encode()

    async def _send(self, name: str, command: Command, args: Sequence[bytes]) -> Any:
        """Run `name` (admit or settle) with `command`'s keys and fixed arguments."""
        with self._io_hold() if self._io_hold is not None else contextlib.nullcontext():
            script = self._scripts[name]
            with self._translated[name]:
                if self._kept is None:  # a cluster client: it routes by the keys' slot
                    if self._cold:
                        await self._warm()
                    return await script.run(self.client, command.keys, command.arguments(args))
                try:
                    return await self._kept.roundtrip(command.pack(script.sha_bytes, args))
                except NoScriptError:
                    await script.load(self.client)
                    return await self._kept.roundtrip(command.pack(script.sha_bytes, args))

    async def _run(self, name: str, keys: list[str], args: Sequence[str | int | float]) -> Any:
        hold = self._io_hold() if self._io_hold is not None else contextlib.nullcontext()
        with hold, self._translated[name]:
            if self._cold:
                await self._warm()
            return await self._scripts[name].run(self.client, keys, args)

    async def _warm(self) -> None:
        """Load a cluster client's slot table once, before its first command."""
        assert self._warming is not None
        assert isinstance(self._client, RedisCluster)
        async with self._warming:
            if self._cold:
                await self._client.initialize()
                self._cold = False

    @staticmethod
    def _int(reply: Any, name: str) -> int:
        with reading(name, reply):
            return int(reply)

    def _listen_for_releases(self) -> None:
        """Subscribe to this process's wake-up channel, from the first time a caller here
        waits (a process whose calls never wait never subscribes).

        A message sent before the subscription is lost, not the permit: once the
        subscription is confirmed (and again after each reconnection), the queued
        calls here that were handed a permit meanwhile are woken (`_wake_handed`).
        """
        if not self._closed and (self._listener is None or self._listener.done()):
            self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        """Wake the waiter here another process's release handed a permit to."""
        attempt = 0
        while not self._closed:
            try:
                async with self._subscription(attempt) as pubsub:
                    await pubsub.subscribe(self.keys.wake + self._origin)
                    quiet_s = 0.0
                    while not self._closed:
                        message = await pubsub.get_message(timeout=1.0)
                        if message is None:
                            quiet_s += 1.0
                            if quiet_s >= 30:  # a silently dead connection fails the ping
                                await pubsub.ping()
                                quiet_s = 0.0
                            continue
                        quiet_s = 0.0
                        if message.get("type") == "message":
                            self._on_released(str(message.get("data", "")))
                        elif message.get("type") == "subscribe":  # heard from now on
                            await self._wake_handed()
            except asyncio.CancelledError:
                raise
            except Exception:
                # Waking early is an optimisation: a hand-over missed meanwhile is
                # found when its waiter's place is next kept (governance.places).
                logger.debug("release listener lost its connection; retrying", exc_info=True)
                attempt += 1
                await asyncio.sleep(1.0)

    async def _wake_handed(self) -> None:
        """Wake the queued calls here that a release handed a permit to (one command per
        source); a failure is left to the keeping of their places."""
        try:
            for source, calls in self._releases.queued_calls().items():
                handed = [f"~{call}" for call in calls]
                scores = await self.client.zmscore(self.keys.permits(source), handed)
                for call, score in zip(calls, scores, strict=True):
                    if score is not None:
                        self._releases.wake_call(call, source)
        except Exception:
            logger.debug("looking for permits handed before listening failed", exc_info=True)

    @contextlib.asynccontextmanager
    async def _subscription(self, attempt: int) -> AsyncIterator[PubSub]:
        """A pub/sub connection: the client's own (a server, Sentinel's current master),
        or on a cluster one node's, the next node after each failure."""
        if not isinstance(self._client, RedisCluster):
            async with self._client.pubsub() as pubsub:
                yield pubsub
            return
        if self._cold:
            await self._warm()
        node = cluster_node_client(self._client, attempt)
        async with node, node.pubsub() as pubsub:
            yield pubsub

    def _on_released(self, data: str) -> None:
        call_id, _, source = data.partition(" ")
        if call_id and source:
            self._releases.wake_call(call_id, source)


class LuaScript:
    """A Lua script run by SHA; loaded again when the server does not know it.

    (redis-py's `AsyncScript` does the same, at about 20 microseconds more per
    call, a sixth of a loopback round trip.)
    """

    __slots__ = ("sha", "sha_bytes", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()
        self.sha_bytes = self.sha.encode()

    async def load(self, client: Redis) -> None:
        """Load the script into the server (after ``NOSCRIPT``)."""
        self.sha = await client.script_load(self.text)
        self.sha_bytes = self.sha.encode()

    async def run(
        self,
        client: Redis,
        keys: Sequence[str | bytes],
        args: Sequence[str | bytes | int | float],
    ) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.load(client)
            return await client.evalsha(self.sha, len(keys), *keys, *args)

    def run_blocking(
        self, client: sync.Redis, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """`run` on a blocking client; any failure of Redis is a `GovernanceBackendError`
        (`errors.translated`)."""
        with _ANY:
            try:
                return client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                self.sha = client.script_load(self.text)
                self.sha_bytes = self.sha.encode()
                return client.evalsha(self.sha, len(keys), *keys, *args)


@dataclass(frozen=True, slots=True)
class _Encoded:
    """What the scripts need of one source's terms, as they are sent."""

    keys: tuple[bytes, bytes, bytes, bytes, bytes, bytes]  # admit's, in its order
    admit_terms: tuple[bytes, ...]
    settle_terms: tuple[bytes, ...]

    @classmethod
    def of(cls, terms: SourceTerms, keys: KeySpace) -> _Encoded:
        quota = terms.quota
        rpm = (quota.rpm or 0) if quota else 0
        tpm = (quota.tpm or 0) if quota else 0
        declared = quota.rpm_window if quota else None
        window = {"sliding": _fmt(WINDOW_S), "bucket": "0", None: "-1"}[declared]
        initial = terms.aimd.initial_limit or 0
        breaker, aimd = terms.breaker, terms.aimd
        group = quota.name if quota else None
        names = (
            keys.permits(terms.name),
            keys.state(terms.name),
            keys.quota(group, terms.name),
            keys.quota_log(group, terms.name),
            keys.queue(terms.name),
            keys.alive(terms.name),
        )
        permits, state, quota_key, log, queue, alive = (name.encode() for name in names)
        admit = (terms.name, terms.max_concurrency, initial, rpm, tpm, window)
        settle = (
            breaker.failure_threshold,
            _fmt(breaker.cooldown_s),
            _fmt(breaker.auth_cooldown_s),
            terms.max_concurrency,
            _fmt(aimd.increase),
            _fmt(aimd.decrease_factor),
            initial,
            tpm,
            _fmt(PROGRESS_TTL_S),
        )
        return cls(
            keys=(permits, state, quota_key, log, queue, alive),
            admit_terms=tuple(str(x).encode() for x in admit),
            settle_terms=tuple(str(x).encode() for x in settle),
        )


def _lua(name: str) -> str:
    return lua_text("polygate_celery.store.redis", name)


def lua_text(package: str, name: str) -> str:
    """The text of `lua/<name>.lua` in `package` (package data), each line
    ``-- include: <other>`` replaced by the text of `lua/<other>.lua` (functions
    several scripts share)."""
    text = resources.files(package).joinpath(f"lua/{name}.lua").read_text()
    return "".join(
        lua_text(package, line.removeprefix(_INCLUDE).strip())
        if line.startswith(_INCLUDE)
        else line
        for line in text.splitlines(keepends=True)
    )


_INCLUDE = "-- include: "


async def run_script(
    script: LuaScript, client: Redis, keys: Sequence[str], args: Sequence[str | int | float]
) -> Any:
    """Run `script`; any failure of Redis is a `GovernanceBackendError`, cause chained
    (`errors.translated`)."""
    with _ANY:
        return await script.run(client, keys, args)
