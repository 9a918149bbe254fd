"""Store layer (Redis): the Lua scripts and what they are sent and answer.

Each script is package data under `lua/` (``-- include:`` lines pulling in the
functions several scripts share), run by SHA with ``EVALSHA`` and loaded again
on ``NOSCRIPT``. Here too: each source's terms and keys packed once as the
scripts read them, the commands the store keeps packed, and the reading of the
scripts' replies (`errors.reading`: a malformed reply is a `StoreReplyError`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis as sync
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from polygate_celery.clock import Clock, WaitsForIO
from polygate_celery.core.quota import (
    ARRIVAL_MARGIN_S,
    BOOKING_SLACK_S,
    LEARNED_TTL_S,
    RESET_EVIDENCE_S,
    WINDOW_KEPT_S,
    WINDOW_S,
)
from polygate_celery.core.standing import (
    CREDIT_TOLERANCE,
    DECAY,
    MAX_CLASSES,
    PLAIN,
    RANK_SPAN,
    Standing,
)
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store.base import GATE_KEPT_S, PROGRESS_TTL_S, TENANT_KEPT_S, AdmitRequest
from polygate_celery.store.redis.codec import fmt
from polygate_celery.store.redis.connect import AsyncClient
from polygate_celery.store.redis.errors import bad_reply, reading, translated
from polygate_celery.store.redis.keys import KeySpace
from polygate_celery.store.redis.wire import Command, KeptConnections

_COMMANDS_KEPT = 256  # packed admit/settle commands kept per store, each kind
_SCRIPTS = ("admit", "settle", "renew", "keep", "progress", "source", "gate", "quota")
# What core's and the store's constants admit.lua and settle.lua read (their headers):
# sent with the terms, packed once, so each script has one source for each.
STANDING_CONSTANTS = (fmt(RANK_SPAN), fmt(DECAY))  # standing.lua's and serving.lua's
STANDING_SPAN_CLASSES = (fmt(RANK_SPAN), MAX_CLASSES)  # source.lua's snapshot
_ADMIT_CONSTANTS = tuple(
    fmt(x).encode()
    for x in (
        *(LEARNED_TTL_S, WINDOW_KEPT_S, ARRIVAL_MARGIN_S, BOOKING_SLACK_S),
        *(RANK_SPAN, DECAY, CREDIT_TOLERANCE, TENANT_KEPT_S),
    )
)
_SETTLE_CONSTANTS = (
    *(fmt(x) for x in (LEARNED_TTL_S, RESET_EVIDENCE_S, GATE_KEPT_S)),
    *STANDING_CONSTANTS,
)
_ANY = translated()  # a script of another layer's: the message is Redis's own


def _flags(reply: Any, n: int, name: str, *, followed: bool = False) -> list[bool]:
    """The first `n` items of a script's reply, each 1 or 0, as booleans; the reply holds
    exactly those unless `followed` (more items after them)."""
    with reading(name, reply):
        flags = [int(x) == 1 for x in reply[:n]]
    if len(flags) != n or (not followed and len(reply) != n):
        raise bad_reply(name, reply)
    return flags


class LuaScript:
    """A Lua script run by SHA with redis-py's own script objects (``EVALSHA``, loaded
    again on ``NOSCRIPT``), on whichever client a call names; admit and settle send the
    same SHA on the store's own path (`_Scripts.send`, wire.py), measured faster."""

    __slots__ = ("_async", "_blocking", "sha_bytes", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        # No registered client: each call names its own (the script is given as bytes,
        # so redis-py needs no client's encoder to hash it).
        self._async = AsyncScript(None, text.encode())  # type: ignore[arg-type]
        self._blocking = Script(None, text.encode())  # type: ignore[arg-type]
        self.sha_bytes = self.sha.encode()

    @property
    def sha(self) -> str:
        return str(self._async.sha)

    async def load(self, client: Redis) -> None:
        """Load the script into the server (after ``NOSCRIPT`` on the store's own path)."""
        self._async.sha = await client.script_load(self.text)
        self.sha_bytes = self.sha.encode()

    async def run(
        self,
        client: Redis,
        keys: Sequence[str | bytes],
        args: Sequence[str | bytes | int | float],
    ) -> Any:
        return await self._async(keys, args, client=client)

    def run_blocking(
        self, client: sync.Redis, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """`run` on a blocking client; any failure of Redis is a `GovernanceBackendError`
        (`errors.translated`)."""
        with _ANY:
            return self._blocking(keys, args, client=client)


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
        window = {"sliding": fmt(WINDOW_S), "bucket": "0", None: "-1"}[declared]
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
            fmt(breaker.cooldown_s),
            fmt(breaker.auth_cooldown_s),
            terms.max_concurrency,
            fmt(aimd.increase),
            fmt(aimd.decrease_factor),
            initial,
            tpm,
            fmt(PROGRESS_TTL_S),
            *_SETTLE_CONSTANTS,
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
    ``-- include: <other>`` (indented or not: a block may include the functions only it
    runs) replaced by the text of `lua/<other>.lua` (functions several scripts share)."""
    text = resources.files(package).joinpath(f"lua/{name}.lua").read_text()
    return "".join(
        lua_text(package, line.strip().removeprefix(_INCLUDE))
        if line.lstrip().startswith(_INCLUDE)
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


class _Commands:
    """admit.lua's and settle.lua's keys and fixed arguments, packed once per scope and
    terms and kept (`_COMMANDS_KEPT` of each kind)."""

    def __init__(self, keys: KeySpace, lease_arg: bytes, origin: str) -> None:
        self.keys = keys
        self._lease_arg = lease_arg
        self._origin = origin
        self._encodings: dict[SourceTerms, _Encoded] = {}
        # Packed commands, by scope and the identity of the terms (held by the entry, so
        # an id is not reused while it is cached): a dictionary look-up per call.
        self._admit_commands: dict[tuple[object, ...], tuple[tuple[SourceTerms, ...], Command]]
        self._admit_commands = {}
        self._settle_commands: dict[tuple[object, ...], tuple[SourceTerms, Command]] = {}

    def _encoded(self, terms: SourceTerms) -> _Encoded:
        """A source's keys and packed terms, built once per distinct terms."""
        encoded = self._encodings.get(terms)
        if encoded is None:
            encoded = _Encoded.of(terms, self.keys)
            self._encodings[terms] = encoded
        return encoded

    def admit(self, request: AdmitRequest) -> Command:
        """admit.lua's keys and fixed arguments for this scope and these candidates (and,
        for a call whose tenant has caps, the tenant's keys at each of them)."""
        candidates = request.candidates
        standing = request.standing
        tenant = standing.tenant if standing.caps is not None else ""
        key = (request.scope, tenant, *map(id, candidates))
        cached = self._admit_commands.get(key)
        if cached is not None:
            return cached[1]
        keys: list[bytes] = []
        tail = [self._lease_arg, self._origin.encode(), self.keys.wake.encode()]
        tail += _ADMIT_CONSTANTS
        for terms in candidates:
            encoded = self._encoded(terms)
            keys += encoded.keys
            tail += encoded.admit_terms
        keys.append(self.keys.gate(request.scope).encode())
        if tenant:
            for terms in candidates:
                keys += self._tenant_keys(terms.name, tenant)
        command = Command(keys, tail)
        if len(self._admit_commands) >= _COMMANDS_KEPT:
            self._admit_commands.clear()  # terms made afresh per call: bounded all the same
        self._admit_commands[key] = (candidates, command)
        return command

    def _tenant_keys(self, source: str, tenant: str) -> tuple[bytes, bytes]:
        """A tenant's keys at a source (admit.lua's and settle.lua's last ones)."""
        return (
            self.keys.tenant_permits(source, tenant).encode(),
            self.keys.tenant_rate(source, tenant).encode(),
        )

    def settle(self, scope: str, terms: SourceTerms, standing: Standing = PLAIN) -> Command:
        """settle.lua's keys and fixed arguments for this scope and source (and the
        tenant's keys there, with its tpm cap, for a call whose tenant has caps)."""
        caps = standing.caps
        tenant = standing.tenant if caps is not None else ""
        key = (scope, id(terms), tenant, caps.tpm if caps is not None else None)
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
            self.keys.class_progress(scope).encode(),
        ]
        tail = [self._origin.encode(), terms.name.encode(), self.keys.wake.encode()]
        tail += encoded.settle_terms
        if caps is not None:
            keys += self._tenant_keys(terms.name, tenant)
            tail.append(str(caps.tpm or 0).encode())
        command = Command(keys, tail)
        if len(self._settle_commands) >= _COMMANDS_KEPT:
            self._settle_commands.clear()
        self._settle_commands[key] = (terms, command)
        return command


class _Scripts:
    """The store's scripts, run on its client under the injected clock's I/O hold, every
    failure of Redis translated (`errors.translated`): admit and settle, packed, over
    kept connections, or on a cluster through the client (it routes by the keys' slot).
    """

    def __init__(self, client: AsyncClient, clock: Clock | None) -> None:
        self._client = client
        # A cluster client learns the slot table on first use; concurrent first calls
        # of a cold client each start that, so the first one does it alone (`warm`).
        self._cold = isinstance(client, RedisCluster)
        self._warming = asyncio.Lock() if self._cold else None
        self._io_hold = clock.waiting_for_io if isinstance(clock, WaitsForIO) else None
        self._by_name = {name: LuaScript(_lua(name)) for name in _SCRIPTS}
        self._translated = {name: translated(name, client) for name in _SCRIPTS}
        self._kept = KeptConnections.of(client)

    @property
    def client(self) -> Redis:
        return self._client  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Close the kept connections (the client is the store's to close)."""
        if self._kept is not None:
            await self._kept.aclose()

    async def send(self, name: str, command: Command, args: Sequence[bytes]) -> Any:
        """Run `name` (admit or settle) with `command`'s keys and fixed arguments."""
        with self._io_hold() if self._io_hold is not None else contextlib.nullcontext():
            script = self._by_name[name]
            with self._translated[name]:
                if self._kept is None:  # a cluster client: it routes by the keys' slot
                    if self._cold:
                        await self.warm()
                    return await script.run(self.client, command.keys, command.arguments(args))
                try:
                    return await self._kept.roundtrip(command.pack(script.sha_bytes, args))
                except NoScriptError:
                    await script.load(self.client)
                    return await self._kept.roundtrip(command.pack(script.sha_bytes, args))

    async def run(self, name: str, keys: list[str], args: Sequence[str | int | float]) -> Any:
        hold = self._io_hold() if self._io_hold is not None else contextlib.nullcontext()
        with hold, self._translated[name]:
            if self._cold:
                await self.warm()
            return await self._by_name[name].run(self.client, keys, args)

    async def warm(self) -> None:
        """Load a cluster client's slot table once, before its first command."""
        if not self._cold:
            return
        assert self._warming is not None
        assert isinstance(self._client, RedisCluster)
        async with self._warming:
            if self._cold:
                await self._client.initialize()
                self._cold = False
