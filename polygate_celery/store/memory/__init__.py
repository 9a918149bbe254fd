"""Store layer: the in-memory store, for one process (tests, the embedded demo).

`store` holds the protocol's operations; an admission is decided in `admit` (its
quotas in `quota`), a settle in `settle`, over the state kept in `state` and
`learned`.
"""

from polygate_celery.store.memory.store import MemoryStore

__all__ = ["MemoryStore"]
