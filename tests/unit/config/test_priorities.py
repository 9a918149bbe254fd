"""Priority classes and tenants in the configuration, and the standing a call's class and
tenant resolve to (SPEC §8)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from polygate_celery.config import GatewayConfig, load_config, parse_config
from polygate_celery.config.reference import page
from polygate_celery.core.standing import PLAIN, Standing, TenantCaps
from polygate_celery.errors import ConfigError

TOML = """
[priorities.interactive]

[priorities.batch]
min_share = 0.1

[priorities.bulk]
min_share = 0.05

[tenant_defaults]
weight = 2

[tenants.acme]
weight = 5

[tenants."ops@example.com"]
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No POLYGATE_* variable of the machine leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("POLYGATE_"):
            monkeypatch.delenv(name)


def loaded(tmp_path: Path, text: str = TOML) -> GatewayConfig:
    path = tmp_path / "polygate.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def refusal(data: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value


def classes(*names: str, **entries: dict[str, Any]) -> GatewayConfig:
    """A configuration with the classes `names` (empty tables) then `entries`, in order."""
    return parse_config({"priorities": {**{n: {} for n in names}, **entries}})


# -- valid configurations ---------------------------------------------------------------


def test_without_classes_every_call_is_in_one_class_and_stands_plain() -> None:
    config = parse_config({})
    assert config.priorities == {}
    assert config.standing() is PLAIN
    assert config.standing(None, None) is PLAIN


def test_a_file_declares_classes_highest_first_and_tenants_with_their_defaults(
    tmp_path: Path,
) -> None:
    config = loaded(tmp_path)
    assert list(config.priorities) == ["interactive", "batch", "bulk"]
    assert config.priorities["batch"].min_share == 0.1
    assert config.tenant_defaults.weight == 2.0
    assert config.tenants["acme"].weight == 5.0
    assert config.tenants["ops@example.com"].weight == 2.0  # tenant_defaults, under the entry
    floors = (0.0, 0.1, 0.05)
    assert config.standing("interactive", "acme") == Standing(0, "acme", 5.0, floors)
    ops = "ops@example.com"
    assert config.standing("batch", ops) == Standing(1, ops, 2.0, floors)
    assert config.standing("bulk", "undeclared") == Standing(2, "undeclared", 2.0, floors)


def test_the_declared_order_is_the_rank_whatever_the_names() -> None:
    config = classes("zeta", "alpha", "mid")
    assert [config.standing(name).rank for name in ("zeta", "alpha", "mid")] == [0, 1, 2]


def test_the_default_class_is_the_last_declared_unless_one_is_marked() -> None:
    assert classes("interactive", "batch").standing().rank == 1
    marked = classes("interactive", batch={"default": True}, bulk={})
    assert marked.standing().rank == 1
    assert marked.standing(tenant="acme").rank == 1


def test_floors_are_every_classs_min_share_by_rank_or_none_when_all_are_zero() -> None:
    assert classes("a", "b").standing("a").floors == ()
    assert classes("a", b={"min_share": 0.25}, c={}).standing("a").floors == (0.0, 0.25, 0.0)


def test_one_class_of_no_floor_and_no_tenant_stands_plain() -> None:
    assert classes("only").standing() is PLAIN
    assert classes("only").standing("only") is PLAIN


def test_the_top_class_of_two_is_not_plain_though_it_ranks_first() -> None:
    top = classes("first", "second").standing("first")
    assert top == PLAIN  # rank 0, no tenant, the default weight, no floors ...
    assert top is not PLAIN  # ... but it stands above a class: it may take its slots


def test_a_call_without_a_tenant_has_the_default_weight() -> None:
    config = parse_config({"tenant_defaults": {"weight": 3}})
    assert config.standing() == Standing(rank=0, tenant="", weight=3.0, floors=())
    assert config.standing().plain  # one class, no tenant: first come, first served


def test_shares_just_under_one_in_all_load() -> None:
    config = classes(a={"min_share": 0.5}, b={"min_share": 0.3}, c={"min_share": 0.19})
    assert config.standing("c").floors == (0.5, 0.3, 0.19)


@pytest.mark.parametrize(
    "tenant",
    ["acme", "Acme-EU", "user@example.com", "org:42", "a.b_c", "x" * 64, "7"],
)
def test_any_well_formed_tenant_may_be_named(tenant: str) -> None:
    standing = parse_config({}).standing(tenant=tenant)
    assert (standing.tenant, standing.weight) == (tenant, 1.0)


def test_a_tenants_entry_matches_its_name_exactly() -> None:
    config = parse_config({"tenants": {"Acme": {"weight": 4}}})
    assert config.standing(tenant="Acme").weight == 4.0
    assert config.standing(tenant="acme").weight == 1.0


def test_a_tenants_caps_come_from_its_entry_else_from_tenant_defaults() -> None:
    config = parse_config(
        {
            "tenant_defaults": {"max_concurrency": 2, "rpm": 60},
            "tenants": {"acme": {"max_concurrency": 8, "tpm": 90_000}, "free": {"weight": 0.5}},
        }
    )
    assert config.standing(tenant="acme").caps == TenantCaps(8, 60, 90_000)
    assert config.standing(tenant="free").caps == TenantCaps(2, 60, None)
    assert config.standing(tenant="customer:42").caps == TenantCaps(2, 60, None)
    assert config.standing().caps is None  # a call of no tenant has no cap
    assert parse_config({}).standing(tenant="acme").caps is None


def test_caps_read_from_a_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYGATE_TENANTS__ACME__RPM", "600")
    text = TOML.replace("weight = 5", "weight = 5\ntpm = 1000") + "max_concurrency = 3\n"
    config = loaded(tmp_path, text)
    assert config.standing(tenant="ops@example.com").caps == TenantCaps(3, None, None)
    assert config.standing(tenant="acme").caps == TenantCaps(None, 600, 1000)


# -- what a call may not name -----------------------------------------------------------


def test_an_unknown_class_is_refused_naming_priority_and_the_classes() -> None:
    with pytest.raises(ConfigError) as info:
        classes("interactive", "batch").standing("urgent")
    assert info.value.field == "priority"
    assert "interactive, batch" in info.value.message


def test_a_class_is_refused_where_none_is_declared() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({}).standing("batch")
    assert info.value.field == "priority"
    assert "[priorities] declares none" in info.value.message


@pytest.mark.parametrize("tenant", ["", "x" * 65, "a b", "a/b", "é", "a\nb", "a*"])
def test_a_malformed_tenant_is_refused_naming_tenant_not_quoting_it(tenant: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({}).standing(tenant=tenant)
    assert info.value.field == "tenant"
    assert tenant not in info.value.message or not tenant


# -- invalid configurations -------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"priorities": {"a": {"min_share": 1.0}}}, "priorities.a.min_share"),
        ({"priorities": {"a": {"min_share": -0.1}}}, "priorities.a.min_share"),
        ({"priorities": {"a": {"min_share": float("nan")}}}, "priorities.a.min_share"),
        ({"priorities": {"a": {"min_share": "0.1"}}}, "priorities.a.min_share"),
        ({"priorities": {"a": {"default": 1}}}, "priorities.a.default"),
        ({"priorities": {"a": {"weight": 2}}}, "priorities.a.weight"),
        ({"priorities": {"Batch": {}}}, "priorities.Batch.[key]"),
        ({"tenants": {"acme": {"weight": 0}}}, "tenants.acme.weight"),
        ({"tenants": {"acme": {"weight": 1001}}}, "tenants.acme.weight"),
        ({"tenants": {"acme": {"max_concurrency": 0}}}, "tenants.acme.max_concurrency"),
        ({"tenants": {"acme": {"rpm": -1}}}, "tenants.acme.rpm"),
        ({"tenants": {"acme": {"tpm": 1.5}}}, "tenants.acme.tpm"),
        ({"tenants": {"acme": {"burst": 2}}}, "tenants.acme.burst"),
        ({"tenant_defaults": {"max_concurrency": 10_001}}, "tenant_defaults.max_concurrency"),
        ({"tenants": {"a b": {}}}, "tenants.a b.[key]"),
        ({"tenant_defaults": {"weight": -1}}, "tenant_defaults.weight"),
        ({"tenant_defaults": {"weight": float("inf")}}, "tenant_defaults.weight"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(data: dict[str, Any], field: str) -> None:
    assert refusal(data).field == field


def test_two_default_classes_are_refused_naming_the_second() -> None:
    error = refusal({"priorities": {"a": {"default": True}, "b": {}, "c": {"default": True}}})
    assert error.field == "priorities.c.default"
    assert "only one class may be the default (a is)" in error.message


@pytest.mark.parametrize(
    ("shares", "field"),
    [
        ((0.5, 0.0, 0.5), "priorities.c.min_share"),
        ((0.1, 0.2, 0.7), "priorities.c.min_share"),  # 1 exactly, whatever floats make of it
        ((0.6, 0.6, 0.0), "priorities.b.min_share"),  # the class that takes the sum to 1
    ],
)
def test_floors_adding_up_to_one_or_more_are_refused(shares: tuple[float, ...], field: str) -> None:
    error = refusal(
        {"priorities": {n: {"min_share": s} for n, s in zip("abc", shares, strict=True)}}
    )
    assert error.field == field
    assert "less than 1" in error.message


# -- the environment --------------------------------------------------------------------


def test_the_environment_overrides_a_class_in_its_place_and_a_tenants_weight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYGATE_PRIORITIES__BATCH__MIN_SHARE", "0.2")
    monkeypatch.setenv("POLYGATE_PRIORITIES__INTERACTIVE__DEFAULT", "true")
    monkeypatch.setenv("POLYGATE_TENANTS__ACME__WEIGHT", "7")
    monkeypatch.setenv("POLYGATE_TENANT_DEFAULTS__WEIGHT", "1.5")
    config = loaded(tmp_path)
    assert list(config.priorities) == ["interactive", "batch", "bulk"]
    assert config.standing() == Standing(0, "", 1.5, (0.0, 0.2, 0.05))
    assert config.standing(tenant="acme").weight == 7.0
    assert config.standing(tenant="ops@example.com").weight == 1.5  # its entry sets none


def test_a_class_the_environment_adds_comes_after_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYGATE_PRIORITIES__BACKFILL__MIN_SHARE", "0.01")
    config = loaded(tmp_path)
    assert list(config.priorities) == ["interactive", "batch", "bulk", "backfill"]
    assert config.standing().rank == 3


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("POLYGATE_PRIORITIES__BATCH__MIN_SHARE", "priorities.batch.min_share"),
        ("POLYGATE_TENANTS__ACME__WEIGHT", "tenants.acme.weight"),
    ],
)
def test_the_environments_bad_text_is_refused_naming_its_field(
    monkeypatch: pytest.MonkeyPatch, name: str, field: str
) -> None:
    monkeypatch.setenv(name, "high")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert info.value.field == field
    assert name in info.value.message


def test_a_single_underscore_before_a_tenant_says_how_to_nest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POLYGATE_TENANTS_ACME__WEIGHT", "3")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert info.value.message.endswith("did you mean POLYGATE_TENANTS__ACME__WEIGHT?")


# -- the manual ---------------------------------------------------------------------------


def test_the_reference_has_a_section_for_classes_and_tenants() -> None:
    text = page()
    assert "\n## Priorities and tenants\n" in text
    assert "### `[priorities.NAME]`" in text
    assert "### `[tenants.NAME] (and [tenant_defaults])`" in text
    assert "| `min_share` | 0 | 0 to < 1 |" in text
    assert "| `weight` | 1 | 0.001 to 1,000 |" in text
