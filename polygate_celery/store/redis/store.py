"""Store layer (Redis): the fleet-wide governance store, one Lua script per operation.

Every read-modify-write is one script from `lua/` (`scripts`: its SHA computed
once, called with `EVALSHA`, loaded again on ``NOSCRIPT``, e.g. after a
``SCRIPT FLUSH`` or a failover). A successful attempt
costs two script calls: `admit` and `settle`. Time inside the scripts is Redis
``TIME``, or the injected clock's time passed as an argument. A call queued
here that another process hands a permit to is woken over this process's
wake-up channel (`wakeups`).

The client (`connect`: one server, Sentinel or a Cluster) runs without hidden
retries and with explicit timeouts: every connection error or timeout becomes a
`StoreUnreachable`, every script error or malformed reply a `StoreReplyError`
(both `GovernanceBackendError`s, translated in `errors`) at once, so a call
fails closed within the socket timeout, and the same client reconnects when
Redis is back (after a failover, to the new master).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from polygate_celery.clock import Clock
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.models import StoreConfig
from polygate_celery.core.quota import LEARNED_TTL_S, WINDOW_S, gcra_spent, requests_spent
from polygate_celery.core.standing import MAX_CLASSES, trimmed
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store.admit import carry_out
from polygate_celery.store.base import (
    GATE_KEPT_S,
    PROGRESS_TTL_S,
    AdmitRequest,
    Denial,
    Grant,
    QuotaSnapshot,
    Settlement,
    SourceSnapshot,
    TenantSnapshot,
    WaitMode,
)
from polygate_celery.store.redis.codec import (
    decode_admit,
    decode_settle,
    encode_admit,
    encode_settle,
    fmt,
)
from polygate_celery.store.redis.connect import AsyncClient, governance_client, redis_client
from polygate_celery.store.redis.errors import bad_reply, reading
from polygate_celery.store.redis.groups import Groups, governance_groups
from polygate_celery.store.redis.keys import KeySpace
from polygate_celery.store.redis.scripts import (
    STANDING_CONSTANTS,
    STANDING_SPAN_CLASSES,
    LuaScript,
    _Commands,
    _flags,
    _Scripts,
    lua_text,
    run_script,
)
from polygate_celery.store.redis.wakeups import _WakeUps
from polygate_celery.store.releases import ReleaseHub, Watch

_GATE_KEPT = fmt(GATE_KEPT_S)
_LEARNED_TTL = fmt(LEARNED_TTL_S)

__all__ = ["PROGRESS_TTL_S", "LuaScript", "RedisStore", "lua_text", "run_script"]


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
        self.keys = KeySpace(prefix, groups or Groups())
        self.lease_s = lease_s
        self._clock = clock
        self._scripts = _Scripts(client, clock)
        self._origin = uuid.uuid4().hex[:12]
        self._commands = _Commands(self.keys, fmt(lease_s).encode(), self._origin)
        self._releases = ReleaseHub()
        self._wakeups = _WakeUps(
            client, self.keys, self._origin, self._releases, self._scripts.warm
        )

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
        self._wakeups.stop()
        await self._scripts.aclose()
        await self._wakeups.aclose()
        await self._client.aclose()

    # -- the protocol --------------------------------------------------------------

    async def admit(self, request: AdmitRequest) -> Grant | Denial:
        wait = request.wait
        args = encode_admit(request, wait, self._now_arg())
        reply = await self._scripts.send("admit", self._commands.admit(request), args)
        answer = carry_out(decode_admit(reply, request, self.lease_s), self._releases)
        if wait is not WaitMode.NONE and isinstance(answer, Denial) and answer.gated_for_s is None:
            self._wakeups.listen()  # someone here is about to wait
            if any(reason == "at_capacity" for _, reason in answer.blocked):
                self._releases.note_queued(request.call_id)
        return answer

    async def settle(self, settlement: Settlement) -> bool:
        terms = settlement.source
        command = self._commands.settle(settlement.scope, terms, settlement.standing)
        args = encode_settle(settlement, self._now_arg())
        reply = await self._scripts.send("settle", command, args)
        reply = decode_settle(reply, settlement)  # a state change is logged here for the fleet
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
                args += [leases[i][1], fmt(leases[i][2])]
            reply = await self._scripts.run("renew", [keys[i] for i in batch], args)
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
            args += STANDING_CONSTANTS
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
                    args += [places[i][1], fmt(places[i][2])]
                order += indices
            reply = await self._scripts.run("keep", keys, args)
            flags = _flags(reply, len(order), "keep", followed=True)
            woken = reply[len(order) :]
            if len(woken) % 2:
                raise bad_reply("keep", reply)
            for call_id, source in zip(woken[::2], woken[1::2], strict=True):
                self._releases.wake_call(str(call_id), str(source))
            for i, flag in zip(order, flags, strict=True):
                kept[i] = flag
        return kept

    async def progress_age_s(self, scope: str, rank: int | None = None) -> float:
        reply = await self._scripts.run(
            "progress",
            [self.keys.progress(scope), self.keys.class_progress(scope)],
            [self._now(), "age", fmt(PROGRESS_TTL_S), "" if rank is None else rank],
        )
        with reading("progress", reply):
            return math.inf if reply == "" else float(reply)

    async def mark_progress(self, scope: str, rank: int | None = None) -> None:
        await self._scripts.run(
            "progress",
            [self.keys.progress(scope), self.keys.class_progress(scope)],
            [self._now(), "mark", fmt(PROGRESS_TTL_S), "" if rank is None else rank],
        )

    async def close_gate(
        self,
        scope: str,
        seconds: float,
        reset: bool = False,
        call_id: str = "",
        error: str | None = None,
    ) -> bool:
        closing = ["close", fmt(seconds), "1" if reset else "0", call_id, error or "", _GATE_KEPT]
        return (
            str(await self._scripts.run("gate", [self.keys.gate(scope)], [self._now(), *closing]))
            == "1"
        )

    async def gate_closed_for_s(self, scope: str) -> float:
        reply = await self._scripts.run("gate", [self.keys.gate(scope)], [self._now(), "read"])
        with reading("gate", reply):
            return float(reply)

    async def pause_source(self, source: str, seconds: float) -> None:
        keys = [self.keys.permits(source), self.keys.state(source)]
        await self._scripts.run("source", keys, [self._now(), "pause", fmt(seconds)])

    async def resume_source(self, source: str) -> None:
        keys = [self.keys.permits(source), self.keys.state(source)]
        await self._scripts.run("source", keys, [self._now(), "resume"])

    async def reset_source(self, source: str) -> None:
        keys = [self.keys.permits(source), self.keys.state(source)]
        await self._scripts.run("source", keys, [self._now(), "reset"])

    async def quota_snapshot(self, quota: QuotaTerms) -> QuotaSnapshot:
        keys = [self.keys.quota(quota.name), self.keys.quota_log(quota.name)]
        reply = await self._scripts.run("quota", keys, [self._now(), fmt(WINDOW_S)])
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

    async def listening(self) -> None:
        """Return once this process hears its wake-up channel (a process subscribes when a
        caller here first waits; for tests and tools that must not miss a message)."""
        self._wakeups.listen()
        await self._wakeups.subscribed.wait()

    async def snapshot(self, source: SourceTerms) -> SourceSnapshot:
        name = source.name
        keys = [
            self.keys.permits(name),
            self.keys.state(name),
            self.keys.queue(name),
            self.keys.alive(name),
        ]
        args: list[str | int | float] = [
            self._now(),
            "snapshot",
            source.max_concurrency,
            source.aimd.initial_limit or 0,
            _LEARNED_TTL,
            *STANDING_SPAN_CLASSES,
        ]
        reply = await self._scripts.run("source", keys, args)
        with reading("snapshot", reply):
            live, limit, mode, failures, paused_for, learned_rpm, learned_tpm = reply[:7]
            by_class = reply[7 : 7 + 3 * MAX_CLASSES]
            by_tenant = reply[7 + 3 * MAX_CLASSES :]
            return SourceSnapshot(
                name=source.name,
                permits_in_use=int(live),
                permit_limit=int(limit),
                breaker=mode,
                breaker_failures=int(failures),
                paused_for_s=float(paused_for),
                learned_rpm=int(float(learned_rpm)) or None,
                learned_tpm=int(float(learned_tpm)) or None,
                waiting=trimmed([int(n) for n in by_class[0::3]]),
                recent_grants=trimmed([float(g) for g in by_class[1::3]]),
                booked=trimmed([int(n) for n in by_class[2::3]]),
                tenants=tuple(
                    sorted(
                        (
                            TenantSnapshot(str(t), int(f), int(w), int(b))
                            for t, f, w, b in zip(*[iter(by_tenant)] * 4, strict=True)
                        ),
                        key=lambda tenant: tenant.tenant,
                    )
                ),
            )

    # -- plumbing ------------------------------------------------------------------

    def _now(self) -> str:
        return "" if self._clock is None else fmt(self._clock.now())

    def _now_arg(self) -> bytes:
        return b"" if self._clock is None else fmt(self._clock.now()).encode()

    @staticmethod
    def _int(reply: Any, name: str) -> int:
        with reading(name, reply):
            return int(reply)
