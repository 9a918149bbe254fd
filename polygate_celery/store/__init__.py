"""Store layer: governance state behind one protocol of atomic operations."""

from polygate_celery.store.base import (
    AdmitRequest,
    BlockReason,
    Denial,
    Grant,
    QuotaSnapshot,
    Settlement,
    SourceSnapshot,
    Store,
)
from polygate_celery.store.factory import store_from_config
from polygate_celery.store.memory import MemoryStore

__all__ = [
    "AdmitRequest",
    "BlockReason",
    "Denial",
    "Grant",
    "MemoryStore",
    "QuotaSnapshot",
    "Settlement",
    "SourceSnapshot",
    "Store",
    "store_from_config",
]
