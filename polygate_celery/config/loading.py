"""Configuration: loading from a TOML file and ``POLYGATE_*`` environment variables.

Precedence, highest first: keyword overrides, environment, file. Nested fields
use ``__`` in the environment: ``POLYGATE_SCOPES__SUMMARISE__STALL_WINDOW_S=120``.
Every invalid value raises `ConfigError` naming its dotted field path; values
themselves are never echoed, since one may be a secret. An unknown key, in the
file or the environment, is named with the closest known one ("did you mean");
`polygate_celery.config.environment` says which ``POLYGATE_*`` variables are
settings and how their text is read.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import types
from collections.abc import Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from polygate_celery.config.environment import NESTED, PREFIX, TypedEnvironment, unknown_variables
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.errors import ConfigError

CONFIG_PATH_ENV = "POLYGATE_CONFIG"
_toml_path: ContextVar[Path | None] = ContextVar("_toml_path", default=None)


class _LoadedConfig(BaseSettings, GatewayConfig):
    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_nested_delimiter=NESTED,
        extra="forbid",
        # Text from the environment is typed by `TypedEnvironment`, as the module says,
        # not by pydantic-settings' own rules; the models are strict.
        strict=False,
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
        environment = TypedEnvironment(
            settings_cls, env_prefix=PREFIX, env_nested_delimiter=NESTED, case_sensitive=False
        )
        path = _toml_path.get()
        if path is None:
            return (init_settings, environment)
        return (init_settings, environment, TomlConfigSettingsSource(settings_cls, path))


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"


def config_error(exc: ValidationError) -> ConfigError:
    """A `ConfigError` listing every problem of `exc` by field path, without input values."""
    problems = [
        (
            _field_path(e["loc"]),
            _unknown_key(e["loc"])
            if e["type"] == "extra_forbidden"
            else _from_environment(e["loc"], e["type"], e["msg"].removeprefix("Value error, ")),
        )
        for e in exc.errors(include_input=False)
    ]
    return ConfigError(problems[0][0], problems[0][1], problems)


# How to write a value of each type in the environment, where its text was not one.
_WRITE = {
    "bool_type": "write true or false",
    "bool_parsing": "write true or false",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "int_from_float": "write a whole number",
    "float_type": "write a number, e.g. 30 or 2.5",
    "float_parsing": "write a number, e.g. 30 or 2.5",
}


def _variable_of(loc: Sequence[int | str]) -> str | None:
    """The ``POLYGATE_*`` variable set that gives the value at `loc`, if one is set."""
    variable = PREFIX + NESTED.join(str(part) for part in loc).upper()
    return variable if any(name.upper() == variable for name in os.environ) else None


def _from_environment(loc: Sequence[int | str], kind: str, message: str) -> str:
    """`message`, naming the environment variable the value came from (and how to write it)."""
    variable = _variable_of(loc)
    if variable is None:
        return message
    hint = f": {_WRITE[kind]}" if kind in _WRITE else ""
    return f"{message} (environment variable {variable}{hint})"


def _unknown_key(loc: Sequence[int | str]) -> str:
    """What to say of a key no model has: the closest one that exists, if any, spelt as the
    environment variable when the key came from one."""
    close = difflib.get_close_matches(str(loc[-1]), _keys_under(loc[:-1]), n=1, cutoff=0.6)
    variable = _variable_of(loc)
    if variable is not None:
        found = f"unknown setting (environment variable {variable})"
        if close:
            fixed = PREFIX + NESTED.join([*map(str, loc[:-1]), close[0]]).upper()
            return f"{found}; did you mean {fixed}?"
        return found
    return f"unknown setting; did you mean {close[0]!r}?" if close else "unknown setting"


def _keys_under(loc: Sequence[int | str]) -> list[str]:
    """The keys the table at `loc` takes (none when it is not a model's)."""
    annotation: Any = GatewayConfig
    for part in loc:
        annotation = _unwrapped(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return []
            annotation = field.annotation
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        else:
            return []
    annotation = _unwrapped(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _unwrapped(annotation: Any) -> Any:
    """`X` of ``Annotated[X, ...]`` and of ``X | None``."""
    if get_origin(annotation) is Annotated:
        return _unwrapped(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        return _unwrapped(options[0]) if len(options) == 1 else annotation
    return annotation


def load_config(path: str | Path | None = None, **overrides: Any) -> GatewayConfig:
    """Load the configuration from a TOML file and ``POLYGATE_*`` environment variables.

    Precedence, highest first: `overrides`, the environment, the file.

    Args:
        path: The TOML file. Default: the one ``$POLYGATE_CONFIG`` names, else
            none (the environment alone).
        **overrides: Top-level settings that win over both (``scopes={...}``).

    Returns:
        The validated configuration.

    Raises:
        ConfigError: The file cannot be read or is not TOML, a setting is not
            valid, or a ``POLYGATE_*`` variable looks like a setting but names
            none; `problems` lists every one by its dotted path, never its value.
    """
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
    unknown = unknown_variables(os.environ)
    if unknown:
        raise ConfigError(unknown[0][0], unknown[0][1], unknown)
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
    """Validate a configuration given as a mapping (no file, no environment).

    Args:
        data: The configuration as TOML would give it: ``{"sources": {...},
            "scopes": {...}}``.

    Returns:
        The validated configuration.

    Raises:
        ConfigError: A setting is not valid; `problems` lists every one.
    """
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc) from None
