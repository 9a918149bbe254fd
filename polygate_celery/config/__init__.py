"""Configuration: sources, quotas, scopes, classes and tenants, from TOML and the environment."""

from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.loading import CONFIG_PATH_ENV, load_config, parse_config
from polygate_celery.config.models import (
    AimdConfig,
    BreakerConfig,
    DeferralConfig,
    QuotaConfig,
    ScopeConfig,
    ScopeSettings,
    SourceConfig,
    SourceSettings,
    StoreConfig,
)
from polygate_celery.config.priority import PriorityConfig, TenantConfig

__all__ = [
    "CONFIG_PATH_ENV",
    "AimdConfig",
    "BreakerConfig",
    "DeferralConfig",
    "GatewayConfig",
    "PriorityConfig",
    "QuotaConfig",
    "ScopeConfig",
    "ScopeSettings",
    "SourceConfig",
    "SourceSettings",
    "StoreConfig",
    "TenantConfig",
    "load_config",
    "parse_config",
]
