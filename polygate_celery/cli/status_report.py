"""Edge (CLI): one reading of the fleet's governance state, for `polygate-celery status`.

Everything is read from the store's own operations (snapshots, progress age,
the gate, quota use) in the store's clock, and the Celery parking lots from
their keys (`store.redis.lots`). Nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.governance.plan import source_terms
from polygate_celery.store.base import QuotaSnapshot, SourceSnapshot
from polygate_celery.store.redis import RedisStore
from polygate_celery.store.redis.lots import LotReading, read_lots


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
    return StatusReading(tuple(readings), await read_lots(store, [app] if app else None))


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
