"""Store layer (Redis): the Celery edge's parking lots under the store's prefix, as an
operator reads them (`polygate-celery status`, the metrics exporter); nothing is written.

A lot is ``{prefix}:v1:parked:<app>@<broker digest>`` (`KeySpace.parked`; the Celery
edge names it, `celery.parking.lot_name`): a sorted set of entry -> due time, with its
``:msg``, ``:claim`` and ``:dead`` keys, and per scope an outage parked
``:scope:<scope>`` (and its ``:probe`` marker). An entry a releaser is publishing counts
as due again only once its claim's lease ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polygate_celery.store.redis.store import RedisStore


@dataclass(frozen=True, slots=True)
class LotReading:
    """A parking lot (``<app>@<broker digest>``): entries parked, how many of them are
    due now, and the dead letters (entries that were not task messages)."""

    app: str
    parked: int
    due: int
    dead: int = 0


def lot_of(name: str) -> str:
    """The lot a key under the parked prefix belongs to: the lot's own sorted set,
    ``<lot>:msg``, ``<lot>:claim``, ``<lot>:dead``, or a scope's index
    ``<lot>:scope:<scope>`` and its probe marker ``<lot>:scope:<scope>:probe``."""
    base, found, _ = name.partition(":scope:")
    if found and base:
        return base
    base, _, suffix = name.rpartition(":")
    return base if base and suffix in {"msg", "claim", "dead"} else name


async def read_lots(store: RedisStore, apps: Sequence[str] | None = None) -> tuple[LotReading, ...]:
    """Every lot under the store's prefix, or the lots of `apps` (their main names: an
    app's lots are one per broker, ``<app>@<digest>``), by name."""
    client = store.client
    prefix = store.keys.parked("")
    patterns = [f"{prefix}*"] if apps is None else [f"{prefix}{app}@*" for app in apps]
    patterns += [f"{prefix}{app}" for app in apps or ()]  # (a lot named as its app alone)
    names = set()
    for pattern in patterns:
        async for key in client.scan_iter(match=pattern, count=1000):
            text = key.decode() if isinstance(key, bytes) else str(key)
            names.add(lot_of(text[len(prefix) :]))
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
