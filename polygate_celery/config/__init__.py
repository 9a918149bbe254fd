"""Configuration: models of sources, quotas and scopes, loaded from TOML and the environment."""

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

__all__ = [
    "CONFIG_PATH_ENV",
    "AimdConfig",
    "BreakerConfig",
    "DeferralConfig",
    "GatewayConfig",
    "QuotaConfig",
    "ScopeConfig",
    "ScopeSettings",
    "SourceConfig",
    "SourceSettings",
    "StoreConfig",
    "load_config",
    "parse_config",
]
