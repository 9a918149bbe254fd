"""Edge (CLI): one reading of the fleet's governance state, for `polygate-celery status`.

Everything is read from the store's own operations (snapshots, progress age,
the gate, quota use) in the store's clock, and the Celery parking lots from
their keys (``{prefix}:v1:parked:<app>``: a sorted set of entry -> due time; an
entry a releaser is publishing counts as due again only once its claim's lease
ends). Nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.governance.plan import source_terms
from polygate_celery.store.base import QuotaSnapshot, SourceSnapshot
from polygate_celery.store.redis import RedisStore


@dataclass(frozen=True, slots=True)
class SourceReading:
    state: SourceSnapshot
    cap: int
    rpm: int | None
    tpm: int | None
    quota: QuotaSnapshot | None


@dataclass(frozen=True, slots=True)
class ScopeReading:
    name: str
    kind: str
    progress_age_s: float
    gate_closed_for_s: float
    sources: tuple[SourceReading, ...]


@dataclass(frozen=True, slots=True)
class LotReading:
    """A parking lot (``<app>@<broker digest>``): entries parked, how many of them are
    due now, and the dead letters (entries that were not task messages)."""

    app: str
    parked: int
    due: int
    dead: int = 0


@dataclass(frozen=True, slots=True)
class StatusReading:
    scopes: tuple[ScopeReading, ...]
    lots: tuple[LotReading, ...]


async def read_status(
    store: RedisStore, config: GatewayConfig, scopes: Sequence[str], app: str | None
) -> StatusReading:
    """The state of `scopes` and their sources, and of `app`'s lot (every app's when None)."""
    sources: dict[str, SourceReading] = {}
    readings = []
    for name in scopes:
        scope = config.scopes[name]
        for source in scope.sources:
            if source not in sources:
                sources[source] = await _read_source(store, config, source)
        readings.append(
            ScopeReading(
                name=name,
                kind=scope.kind,
                progress_age_s=await store.progress_age_s(name),
                gate_closed_for_s=await store.gate_closed_for_s(name),
                sources=tuple(sources[s] for s in scope.sources),
            )
        )
    return StatusReading(tuple(readings), await _read_lots(store, app))


async def _read_source(store: RedisStore, config: GatewayConfig, name: str) -> SourceReading:
    terms = source_terms(config, name)
    quota = terms.quota
    return SourceReading(
        state=await store.snapshot(terms),
        cap=terms.max_concurrency,
        rpm=quota.rpm if quota else None,
        tpm=quota.tpm if quota else None,
        quota=await store.quota_snapshot(quota) if quota else None,
    )


def _lot_of(name: str) -> str:
    """The lot a key under the parked prefix belongs to: the lot's own sorted set,
    ``<lot>:msg``, ``<lot>:claim``, ``<lot>:dead``, or a scope's index
    ``<lot>:scope:<scope>`` and its probe marker ``<lot>:scope:<scope>:probe``."""
    base, found, _ = name.partition(":scope:")
    if found and base:
        return base
    base, _, suffix = name.rpartition(":")
    return base if base and suffix in {"msg", "claim", "dead"} else name


async def _read_lots(store: RedisStore, app: str | None) -> tuple[LotReading, ...]:
    """`app`'s lots (one per broker), or every lot under the prefix."""
    client = store.client
    prefix = store.keys.parked("")
    names = set()
    async for key in client.scan_iter(match=f"{prefix}{app}@*" if app else f"{prefix}*"):
        names.add(_lot_of((key.decode() if isinstance(key, bytes) else str(key))[len(prefix) :]))
    if not names:
        return ()
    seconds, micros = await client.time()
    now = seconds + micros / 1_000_000
    lots = []
    for name in sorted(names):
        lot = store.keys.parked(name)
        async with client.pipeline(transaction=False) as pipe:
            pipe.zcard(lot)
            pipe.zcount(lot, "-inf", now)
            pipe.hlen(f"{lot}:dead")
            parked, due, dead = await pipe.execute()
        lots.append(LotReading(name, int(parked), int(due), int(dead)))
    return tuple(lots)
