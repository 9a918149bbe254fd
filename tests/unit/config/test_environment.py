"""``POLYGATE_*`` variables: a typo is an error, never silence; text is read as typed values."""

from __future__ import annotations

import os

import pytest

from polygate_celery.config import load_config
from polygate_celery.errors import ConfigError

SECRET = "Env-pw-4b1d-secret"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No POLYGATE_* variable of the machine leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("POLYGATE_"):
            monkeypatch.delenv(name)


def refused(monkeypatch: pytest.MonkeyPatch, **variables: str) -> ConfigError:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_config()
    return info.value


# -- unknown variables -------------------------------------------------------------


def test_a_typo_in_the_stores_table_is_an_error_not_an_in_memory_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = refused(monkeypatch, POLYGATE_STOR__REDIS_URL=f"redis://:{SECRET}@redis:6379/0")
    assert error.field == "POLYGATE_STOR__REDIS_URL"
    assert "did you mean POLYGATE_STORE__REDIS_URL?" in error.message
    assert SECRET not in str(error) + repr(error)


def test_a_typo_in_the_scopes_table_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    error = refused(monkeypatch, POLYGATE_SCOPE__SUMMARISE__STALL_WINDOW_S="60")
    assert error.field == "POLYGATE_SCOPE__SUMMARISE__STALL_WINDOW_S"
    assert "did you mean POLYGATE_SCOPES__SUMMARISE__STALL_WINDOW_S?" in error.message


def test_a_single_underscore_where_a_double_one_nests_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = refused(monkeypatch, POLYGATE_STORE_REDIS_URL="redis://redis:6379/0")
    assert error.field == "POLYGATE_STORE_REDIS_URL"
    assert "did you mean POLYGATE_STORE__REDIS_URL?" in error.message


def test_a_near_miss_of_a_top_level_setting_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    error = refused(monkeypatch, POLYGATE_INCLUDE_BODY="true")
    assert "did you mean POLYGATE_INCLUDE_BODIES?" in error.message


def test_a_near_miss_key_deeper_down_names_the_variable_meant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = refused(monkeypatch, POLYGATE_STORE__LEASE="5")
    assert error.field == "store.lease"
    assert error.message == (
        "unknown setting (environment variable POLYGATE_STORE__LEASE); "
        "did you mean POLYGATE_STORE__LEASE_S?"
    )


def test_every_unknown_variable_is_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    error = refused(monkeypatch, POLYGATE_STOR__LEASE_S="5", POLYGATE_QUOTA="{}")
    assert {path for path, _ in error.problems} == {"POLYGATE_STOR__LEASE_S", "POLYGATE_QUOTA"}


@pytest.mark.parametrize(
    "name",
    [
        "POLYGATE_REDIS_URL",  # the demo's
        "POLYGATE_COMPOSE_REDIS_PORT",  # docker compose's
        "POLYGATE_SOAK",  # the test suite's
        "POLYGATE_TEST_REDIS_URL",
        "POLYGATE_BENCH_BROKER",  # the benchmarks'
        "POLYGATE_RABBITMQ_BROKER",
    ],
)
def test_variables_that_are_not_settings_are_left_alone(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "1")
    assert load_config().sources == {}


# -- typed text --------------------------------------------------------------------


def test_numbers_and_flags_are_read_from_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_SOURCES__A__TIMEOUT_S", "30")
    monkeypatch.setenv("POLYGATE_SOURCES__A__MAX_CONCURRENCY", "4")
    monkeypatch.setenv("POLYGATE_SOURCES__A__STREAM", "TRUE")
    monkeypatch.setenv("POLYGATE_SOURCES__A__BREAKER__COOLDOWN_S", "2.5e1")
    monkeypatch.setenv("POLYGATE_INCLUDE_BODIES", "false")
    monkeypatch.setenv("POLYGATE_DEFERRAL__JITTER", ".5")
    config = load_config()
    a = config.sources["a"]
    assert (a.timeout_s, a.max_concurrency, a.stream) == (30.0, 4, True)
    assert a.breaker.cooldown_s == 25.0
    assert (config.include_bodies, config.deferral.jitter) == (False, 0.5)


def test_lists_and_tables_are_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_SCOPES__S__SOURCES", '["a"]')
    monkeypatch.setenv("POLYGATE_SCOPES__S__KIND", "chat")
    monkeypatch.setenv("POLYGATE_SOURCES", '{"a": {"max_concurrency": 3}}')
    monkeypatch.setenv("POLYGATE_STORE__SENTINELS", "s1:26379,s2:26379")
    monkeypatch.setenv("POLYGATE_STORE__SERVICE_NAME", "mymaster")
    config = load_config()
    assert config.scopes["s"].sources == ["a"]
    assert config.sources["a"].max_concurrency == 3
    assert config.store.sentinels == ["s1:26379", "s2:26379"]


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [
        ("POLYGATE_INCLUDE_BODIES", "yes", "include_bodies"),
        ("POLYGATE_SOURCES__A__MAX_CONCURRENCY", "true", "sources.a.max_concurrency"),
        ("POLYGATE_SOURCES__A__MAX_CONCURRENCY", "2.5", "sources.a.max_concurrency"),
        ("POLYGATE_SOURCES__A__TIMEOUT_S", "ten", "sources.a.timeout_s"),
        ("POLYGATE_SOURCES__A__TIMEOUT_S", "inf", "sources.a.timeout_s"),
        ("POLYGATE_STORE__LEASE_S", "1e308", "store.lease_s"),
    ],
)
def test_text_that_is_not_what_the_setting_takes_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, field: str
) -> None:
    assert refused(monkeypatch, **{name: value}).field == field


def test_a_refused_value_names_its_variable_and_how_to_write_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = refused(monkeypatch, POLYGATE_INCLUDE_BODIES="yes")
    assert error.message == (
        "Input should be a valid boolean "
        "(environment variable POLYGATE_INCLUDE_BODIES: write true or false)"
    )
