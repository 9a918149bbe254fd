"""polygate_celery: governed, fleet-wide AI model calls from Celery workers.

Every call runs one governance loop: pick a runnable source (permits, breaker,
adaptive concurrency, quotas, pauses), retry real failures within a retry
budget, wait out rate limits within a separate stall budget, and give up with a
clear verdict (`AllSourcesExhausted`).
"""

from polygate_celery.clock import Clock, SystemClock
from polygate_celery.config import GatewayConfig, load_config, parse_config
from polygate_celery.core.outcome import AttemptRecord, Outcome, OutcomeKind
from polygate_celery.errors import (
    AllSourcesExhausted,
    ConfigError,
    DeferralBudgetExceeded,
    GatewayUnavailableError,
    GovernanceBackendError,
    PolygateError,
    SourceFatalError,
    StoreReplyError,
    StoreUnreachable,
)
from polygate_celery.governance import CallResult, Gateway
from polygate_celery.sources import Source
from polygate_celery.store import MemoryStore, Store

__version__ = "0.1.0.dev0"

__all__ = [
    "AllSourcesExhausted",
    "AttemptRecord",
    "CallResult",
    "Clock",
    "ConfigError",
    "DeferralBudgetExceeded",
    "Gateway",
    "GatewayConfig",
    "GatewayUnavailableError",
    "GovernanceBackendError",
    "MemoryStore",
    "Outcome",
    "OutcomeKind",
    "PolygateError",
    "Source",
    "SourceFatalError",
    "Store",
    "StoreReplyError",
    "StoreUnreachable",
    "SystemClock",
    "__version__",
    "load_config",
    "parse_config",
]
