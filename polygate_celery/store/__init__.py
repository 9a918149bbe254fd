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
    TenantSnapshot,
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
    "TenantSnapshot",
    "store_from_config",
]
