"""Configuration: reading ``POLYGATE_*`` environment variables, typed and checked by name.

Which variables are settings. A name with a double underscore
(``POLYGATE_STORE__REDIS_URL``) is a nested setting, and one without names a
top-level setting (``POLYGATE_INCLUDE_BODIES``, or a whole table as JSON,
``POLYGATE_SCOPES``). A setting whose table does not exist
(``POLYGATE_STOR__REDIS_URL``), a name that begins with a table's name and one
underscore (``POLYGATE_STORE_REDIS_URL``) and a near-miss of a top-level
setting (``POLYGATE_INCLUDE_BODY``) are errors, each with a "did you mean": a
typo must not fall back silently to a default such as the in-memory store.
Any other ``POLYGATE_*`` name without a double underscore is not a setting and
is left to whoever reads it (``POLYGATE_CONFIG``, the demo's
``POLYGATE_REDIS_URL``, docker compose's ``POLYGATE_COMPOSE_*``). A wrong key
deeper down (``POLYGATE_STORE__REDIS_UR``) is refused by the models like one in
the file.

How values are read. A value is text; it becomes what its setting takes, as
TOML would write it: a whole number for an integer setting (``8``), a decimal
number for a duration (``30``, ``2.5``, ``1e3``), ``true`` or ``false`` (any
case) for a flag, the text itself for the rest; a list or a table is JSON. Text
that is none of these for a typed setting stays text, and the setting refuses
it by name (``yes`` is not a flag, ``ten`` not a number).
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_settings import EnvSettingsSource

from polygate_celery.config.gateway import GatewayConfig

PREFIX = "POLYGATE_"
NESTED = "__"
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
# A name follows: POLYGATE_SCOPES__<NAME>__...
_NAMED_TABLES = {"sources", "quotas", "scopes", "priorities", "tenants"}


class TypedEnvironment(EnvSettingsSource):
    """pydantic-settings' environment source, its text values read as the settings take them."""

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        return {
            key: typed(value, GatewayConfig.model_fields[key].annotation)
            if key in GatewayConfig.model_fields
            else value
            for key, value in data.items()
        }


def typed(value: Any, annotation: Any) -> Any:
    """`value` with every text inside it read as what `annotation` takes (see the module)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return typed(value, args[0])
    if origin in (Union, types.UnionType):
        for option in (a for a in args if a is not type(None)):
            converted = typed(value, option)
            if converted is not value:
                return converted
        return value
    if isinstance(value, dict):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            fields = annotation.model_fields
            return {
                k: typed(v, fields[k].annotation) if k in fields else v for k, v in value.items()
            }
        if origin is dict:
            return {k: typed(v, args[1]) for k, v in value.items()}
        return value
    if isinstance(value, list) and origin is list:
        return [typed(v, args[0]) for v in value]
    if isinstance(value, str):
        return _scalar(value, annotation)
    return value


def _scalar(text: str, annotation: Any) -> Any:
    word = text.strip()
    if annotation is bool:
        return {"true": True, "false": False}.get(word.lower(), text)
    if annotation is int:
        return int(word) if _INTEGER.fullmatch(word) else text
    if annotation is float:
        return float(word) if _DECIMAL.fullmatch(word) else text
    return text


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, why) for each ``POLYGATE_*`` variable that looks like a setting but names
    none at the top level (see the module for the rule). Values are never quoted."""
    tables = sorted(GatewayConfig.model_fields)
    problems: list[tuple[str, str]] = []
    for variable in sorted(environ):
        if not variable.upper().startswith(PREFIX):
            continue
        rest = variable[len(PREFIX) :].lower()
        head, nested, tail = rest.partition(NESTED)
        if head in tables:
            continue
        if nested:
            table = next((t for t in tables if head.startswith(f"{t}_")), None)
            if table is not None:  # POLYGATE_SOURCES_A__TIMEOUT_S
                close = [table]
                tail = f"{head[len(table) + 1 :]}{NESTED}{tail}"
            else:
                close = difflib.get_close_matches(head, tables, n=1, cutoff=0.6)
            hint = f"; did you mean {_variable(close[0], tail)}?" if close else ""
            problems.append((variable, f"no setting table {head!r} ({_known(tables)}){hint}"))
            continue
        table = next((t for t in tables if rest.startswith(f"{t}_")), None)
        if table is not None:
            example = (
                _variable(table, rest[len(table) + 1 :])
                if table not in _NAMED_TABLES
                else f"{PREFIX}{table.upper()}{NESTED}<NAME>{NESTED}<SETTING>"
            )
            problems.append(
                (variable, f"nested settings take a double underscore; did you mean {example}?")
            )
            continue
        close = difflib.get_close_matches(rest, tables, n=1, cutoff=0.8)
        if close:
            problems.append((variable, f"not a setting; did you mean {_variable(close[0])}?"))
    return problems


def _variable(table: str, tail: str = "") -> str:
    return f"{PREFIX}{table.upper()}" + (f"{NESTED}{tail.upper()}" if tail else "")


def _known(tables: list[str]) -> str:
    return "the tables are " + ", ".join(t for t in tables if t != "include_bodies")
