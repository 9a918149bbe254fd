"""`.env.example` documents every configuration field, with its real default, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from polygate_celery.config import (
    AimdConfig,
    BreakerConfig,
    DeferralConfig,
    PriorityConfig,
    QuotaConfig,
    ScopeConfig,
    ScopeSettings,
    SourceConfig,
    SourceSettings,
    StoreConfig,
    TenantConfig,
)

ENV_EXAMPLE = Path(__file__).resolve().parents[3] / ".env.example"
LINE = re.compile(r"^#\s*(POLYGATE_[A-Z0-9_]+)=(\S*)(?:\s+#\s*(.*))?$")
# Not under a table; the POLYGATE_COMPOSE_* ones are read by docker-compose.yml only.
TOP_LEVEL = {
    "POLYGATE_CONFIG",
    "POLYGATE_INCLUDE_BODIES",
    "POLYGATE_COMPOSE_REDIS_PORT",
    "POLYGATE_COMPOSE_FLOWER_PORT",
    "POLYGATE_COMPOSE_METRICS_PORT",
}
NESTED: dict[str, type[BaseModel]] = {"breaker": BreakerConfig, "aimd": AimdConfig}
# Top-level table → (model under it, whether a name segment follows).
TABLES: dict[str, tuple[type[BaseModel], bool]] = {
    "store": (StoreConfig, False),
    "deferral": (DeferralConfig, False),
    "source_defaults": (SourceSettings, False),
    "sources": (SourceConfig, True),
    "quotas": (QuotaConfig, True),
    "scope_defaults": (ScopeSettings, False),
    "scopes": (ScopeConfig, True),
    "priorities": (PriorityConfig, True),
    "tenant_defaults": (TenantConfig, False),
    "tenants": (TenantConfig, True),
}


def documented() -> dict[str, tuple[str, str]]:
    """Variable name → (value after "=", meaning after "#")."""
    found: dict[str, tuple[str, str]] = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        match = LINE.match(line.strip())
        if match:
            name, value, meaning = match.groups()
            assert name not in found, f"{name} is documented twice"
            found[name] = (value, meaning or "")
    return found


VARS = documented()


def resolve(name: str) -> tuple[type[BaseModel], str, bool]:
    """(model, field, is a defaults table) that a POLYGATE_* variable sets."""
    table, *rest = name.removeprefix("POLYGATE_").lower().split("__")
    model, named = TABLES[table]
    if named:
        _entry, *rest = rest
    if len(rest) == 2 and rest[0] in NESTED:
        model = NESTED[rest[0]]
        rest = rest[1:]
    (field,) = rest
    assert field in model.model_fields, f"{name}: {model.__name__} has no field {field!r}"
    return model, field, table.endswith("_defaults")


def paths(model: type[BaseModel], *, defaults: bool) -> set[str]:
    """Fields of `model` as documented: under a defaults table or under a named entry."""
    covered: set[str] = set()
    for name in VARS:
        if name in TOP_LEVEL:
            continue
        owner, field, is_defaults = resolve(name)
        if owner is model and is_defaults == defaults:
            covered.add(field)
    return covered


def test_the_example_exists_and_documents_variables() -> None:
    assert ENV_EXAMPLE.is_file()
    assert "POLYGATE_CONFIG" in VARS
    assert len(VARS) > 30


def test_every_documented_variable_names_a_real_field() -> None:
    for name in VARS:
        if name not in TOP_LEVEL:
            resolve(name)


def test_every_documented_variable_has_a_meaning() -> None:
    for name, (_, meaning) in VARS.items():
        if name not in TOP_LEVEL:
            assert meaning.strip(), f"{name} has no one-line meaning"


@pytest.mark.parametrize(
    ("model", "defaults", "expected"),
    [
        (SourceSettings, True, {f for f in SourceSettings.model_fields if f not in NESTED}),
        (BreakerConfig, True, set(BreakerConfig.model_fields)),
        (AimdConfig, True, set(AimdConfig.model_fields)),
        (
            SourceConfig,
            False,
            set(SourceConfig.model_fields) - set(SourceSettings.model_fields),
        ),
        (QuotaConfig, False, set(QuotaConfig.model_fields)),
        (StoreConfig, False, set(StoreConfig.model_fields)),
        (DeferralConfig, False, set(DeferralConfig.model_fields)),
        (ScopeSettings, True, set(ScopeSettings.model_fields)),
        (PriorityConfig, False, set(PriorityConfig.model_fields)),
        (TenantConfig, True, set(TenantConfig.model_fields)),
        (
            ScopeConfig,
            False,
            set(ScopeConfig.model_fields) - set(ScopeSettings.model_fields),
        ),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_every_field_is_documented(
    model: type[BaseModel], defaults: bool, expected: set[str]
) -> None:
    missing = expected - paths(model, defaults=defaults)
    assert not missing, f"{model.__name__} fields missing from .env.example: {sorted(missing)}"


def test_every_field_of_every_model_is_mentioned() -> None:
    # A nested table (breaker, aimd) is mentioned through its own keys.
    mentioned = {part for n in VARS for part in n.removeprefix("POLYGATE_").lower().split("__")}
    for model in (
        SourceConfig,
        ScopeConfig,
        QuotaConfig,
        BreakerConfig,
        AimdConfig,
        StoreConfig,
        DeferralConfig,
        PriorityConfig,
        TenantConfig,
    ):
        missing = set(model.model_fields) - mentioned
        assert not missing, f"{model.__name__}: {sorted(missing)}"


def test_defaults_tables_show_the_real_defaults() -> None:
    for name, (value, _) in VARS.items():
        if name in TOP_LEVEL:
            continue
        model, field, is_defaults = resolve(name)
        if not is_defaults:
            continue
        default = model.model_fields[field].default
        if default is None:
            assert value == "", f"{name}: default is unset, the example shows {value!r}"
        elif isinstance(default, bool):
            assert value == str(default).lower(), f"{name}: default is {default}, shows {value!r}"
        else:
            assert float(value) == default, f"{name}: default is {default}, shows {value!r}"


def test_budget_semantics_are_described_correctly() -> None:
    text = ENV_EXAMPLE.read_text(encoding="utf-8")
    flat = " ".join(line.lstrip("# ").strip() for line in text.splitlines())
    assert "timeout_s may be larger than stall_window_s" in flat
    assert "a single timeout can never cause a stalled verdict" in flat
    assert "conservative" in flat
    assert "redundant" in flat
    assert "lowercase" in flat
    assert "hyphen" in flat
    assert not re.search(r"stall_window_s\s+must\s+(be\s+)?(exceed|greater|larger)", flat)
