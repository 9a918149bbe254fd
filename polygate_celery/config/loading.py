"""Configuration: loading from a TOML file and ``POLYGATE_*`` environment variables.

Precedence, highest first: keyword overrides, environment, file. Nested fields
use ``__`` in the environment: ``POLYGATE_SCOPES__SUMMARISE__STALL_WINDOW_S=120``.
Every invalid value raises `ConfigError` naming its dotted field path; values
themselves are never echoed, since one may be a secret.
"""

from __future__ import annotations

import os
import re
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.errors import ConfigError

CONFIG_PATH_ENV = "POLYGATE_CONFIG"
_toml_path: ContextVar[Path | None] = ContextVar("_toml_path", default=None)


class _LoadedConfig(BaseSettings, GatewayConfig):
    model_config = SettingsConfigDict(
        env_prefix="POLYGATE_", env_nested_delimiter="__", extra="forbid"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _toml_path.get()
        if path is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, path))


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"


def config_error(exc: ValidationError) -> ConfigError:
    """A `ConfigError` listing every problem of `exc` by field path, without input values."""
    problems = [
        (_field_path(e["loc"]), e["msg"].removeprefix("Value error, "))
        for e in exc.errors(include_input=False)
    ]
    return ConfigError(problems[0][0], problems[0][1], problems)


def load_config(path: str | Path | None = None, **overrides: Any) -> GatewayConfig:
    """Load the configuration from `path` (or ``$POLYGATE_CONFIG``) and the environment."""
    if path is None and os.environ.get(CONFIG_PATH_ENV):
        path = os.environ[CONFIG_PATH_ENV]
    toml_path = Path(path) if path is not None else None
    if toml_path is not None:
        try:
            with toml_path.open("rb") as fh:
                tomllib.load(fh)
        except OSError as exc:
            raise ConfigError("<file>", f"cannot read {toml_path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("<file>", f"{toml_path} is not valid TOML: {exc}") from None
    token = _toml_path.set(toml_path)
    try:
        loaded = _LoadedConfig(**overrides)
    except ValidationError as exc:
        raise config_error(exc) from None
    except SettingsError as exc:  # e.g. POLYGATE_SCOPES='not json'
        named = re.search(r'field "([^"]+)"', str(exc))
        field = named.group(1) if named else "<environment>"
        raise ConfigError(field, "cannot parse the value given in the environment") from None
    finally:
        _toml_path.reset(token)
    return loaded


def parse_config(data: dict[str, Any]) -> GatewayConfig:
    """Validate a configuration given as a mapping (no file, no environment)."""
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc) from None
