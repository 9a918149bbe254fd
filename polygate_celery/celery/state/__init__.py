"""Celery edge: the parking lots and run markers behind one protocol (`base`), on Redis
(`redis`) or in memory (`memory`)."""

from polygate_celery.celery.state.base import (
    Begun,
    CeleryState,
    EndMode,
    Lot,
    MarkerTerms,
    ParkedEntry,
    RunEnding,
    RunMarkers,
    RunStart,
    Verdict,
)
from polygate_celery.celery.state.memory import MemoryCeleryState, MemoryLot, MemoryRunMarkers
from polygate_celery.celery.state.redis import (
    ParkingLot,
    RedisCeleryState,
    RedisRunMarkers,
    run_keys,
)

__all__ = [
    "Begun",
    "CeleryState",
    "EndMode",
    "Lot",
    "MarkerTerms",
    "MemoryCeleryState",
    "MemoryLot",
    "MemoryRunMarkers",
    "ParkedEntry",
    "ParkingLot",
    "RedisCeleryState",
    "RedisRunMarkers",
    "RunEnding",
    "RunMarkers",
    "RunStart",
    "Verdict",
    "run_keys",
]
