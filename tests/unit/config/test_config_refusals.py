"""Configuration that is wrong is refused at load, naming the field: URLs, bounds, types."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from polygate_celery.config import GatewayConfig, load_config, parse_config
from polygate_celery.config.reference import TABLES
from polygate_celery.errors import ConfigError

PASSWORD = "Rd5-hunter2-secret"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No POLYGATE_* variable of the machine leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("POLYGATE_"):
            monkeypatch.delenv(name)


def refused(tmp_path: Path, toml: str) -> ConfigError:
    """The error loading `toml` as a configuration file raises."""
    path = tmp_path / "polygate.toml"
    path.write_text(toml, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


def source(line: str) -> str:
    return f'[sources.a]\nmodel = "m"\n{line}\n\n[scopes.s]\nkind = "chat"\nsources = ["a"]\n'


def scope(line: str) -> str:
    return f'[sources.a]\n\n[scopes.s]\nkind = "chat"\nsources = ["a"]\n{line}\n'


# -- URLs --------------------------------------------------------------------------


def test_a_base_url_that_is_not_a_url_is_refused(tmp_path: Path) -> None:
    error = refused(tmp_path, source('base_url = "not a url"'))
    assert error.field == "sources.a.base_url"
    assert "no scheme" in error.message


def test_a_base_url_that_is_not_http_is_refused(tmp_path: Path) -> None:
    error = refused(tmp_path, source('base_url = "ftp://files.example.com/v1"'))
    assert error.field == "sources.a.base_url"
    assert "only http:// and https://" in error.message


def test_a_base_url_without_a_host_is_refused(tmp_path: Path) -> None:
    assert refused(tmp_path, source('base_url = "http:///v1"')).field == "sources.a.base_url"


def test_a_base_url_with_credentials_is_never_quoted(tmp_path: Path) -> None:
    error = refused(tmp_path, source(f'base_url = "https://u:{PASSWORD}@host:x/v1"'))
    assert error.field == "sources.a.base_url"
    assert PASSWORD not in str(error) + repr(error)


@pytest.mark.parametrize("url", ["http://vllm:8000/v1", "https://api.openai.com/v1"])
def test_http_and_https_base_urls_load(tmp_path: Path, url: str) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(source(f'base_url = "{url}"'), encoding="utf-8")
    assert load_config(path).sources["a"].base_url == url


def test_a_store_url_option_redis_py_would_refuse_later_is_refused(tmp_path: Path) -> None:
    url = f"rediss://:{PASSWORD}@redis:6380/0?ssl_cert_reqs=bogus"
    error = refused(tmp_path, f'[store]\nredis_url = "{url}"\n')
    assert error.field == "store.redis_url"
    assert "'ssl_cert_reqs'" in error.message
    assert PASSWORD not in str(error)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("no_such_option=1", "no_such_option"),
        ("health_check_interval=soon", "health_check_interval"),
        ("ssl_min_version=99", "ssl_min_version"),  # a TLS option on a plain connection
        ("socket_timeout=1e10", "socket_timeout"),  # would replace store.socket_timeout_s
    ],
)
def test_other_store_url_options_that_would_fail_later_are_refused(
    tmp_path: Path, query: str, named: str
) -> None:
    error = refused(tmp_path, f'[store]\nredis_url = "redis://redis:6379/0?{query}"\n')
    assert (error.field, f"'{named}'" in error.message) == ("store.redis_url", True)


def test_store_url_options_redis_py_takes_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    url = "rediss://:pw@redis:6380/0?ssl_cert_reqs=required&client_name=w&protocol=3"
    path.write_text(f'[store]\nredis_url = "{url}"\n', encoding="utf-8")
    assert load_config(path).store.topology == "server"


# -- bounds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        (source("timeout_s = 1e308"), "sources.a.timeout_s"),
        (scope("stall_window_s = 1e308"), "scopes.s.stall_window_s"),
        ("[store]\nsocket_timeout_s = 1e10\n", "store.socket_timeout_s"),
        (scope("poll_interval_s = 1e-300"), "scopes.s.poll_interval_s"),
        (scope("backoff_base_s = 1e-300"), "scopes.s.backoff_base_s"),
        (scope("backoff_max_s = 1e-300"), "scopes.s.backoff_max_s"),
        ("[store]\nlease_s = 1e308\n", "store.lease_s"),
        (source("max_body_bytes = 10"), "sources.a.max_body_bytes"),
    ],
    ids=[
        "timeout-1e308",
        "stall-window-1e308",
        "socket-timeout-1e10",
        "poll-interval-1e-300",
        "backoff-base-1e-300",
        "backoff-max-1e-300",
        "lease-1e308",
        "body-limit-10-bytes",
    ],
)
def test_a_value_outside_its_bounds_is_refused(tmp_path: Path, toml: str, field: str) -> None:
    error = refused(tmp_path, toml)
    assert error.field == field
    assert "less than or equal" in error.message or "greater than or equal" in error.message


def numeric(annotation: Any) -> bool:
    """Whether `annotation` (or an option of it) is a number."""
    if annotation in (int, float):
        return True
    return any(numeric(arg) for arg in get_args(annotation))


def numeric_fields() -> list[tuple[str, type[BaseModel], str]]:
    return [
        (title, model, name)
        for title, model, skip in TABLES
        for name, info in model.model_fields.items()
        if name not in skip and any(hasattr(m, "le") or hasattr(m, "lt") for m in info.metadata)
    ]


def test_every_numeric_setting_has_an_upper_and_a_lower_bound() -> None:
    unbounded = []
    for model in {model for _, model, _ in TABLES}:
        for name, info in model.model_fields.items():
            if not numeric(info.annotation):
                continue
            low = any(hasattr(m, "ge") or hasattr(m, "gt") for m in info.metadata)
            high = any(hasattr(m, "le") or hasattr(m, "lt") for m in info.metadata)
            if not (low and high):
                unbounded.append(f"{model.__name__}.{name}")
    assert not unbounded


@pytest.mark.parametrize(
    ("title", "model", "name"), numeric_fields(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_default_lies_within_its_bounds(
    title: str, model: type[BaseModel], name: str
) -> None:
    info = model.model_fields[name]
    default = info.get_default(call_default_factory=True)
    if default is None:
        return
    for bound in info.metadata:
        for attr, holds in (
            ("ge", lambda d, b: d >= b),
            ("gt", lambda d, b: d > b),
            ("le", lambda d, b: d <= b),
            ("lt", lambda d, b: d < b),
        ):
            if hasattr(bound, attr):
                assert holds(default, getattr(bound, attr)), f"{title} {name}"


def test_the_reference_shows_each_range() -> None:
    from polygate_celery.config.reference import reference  # noqa: PLC0415

    text = reference()
    assert "| `lease_s` | 30 | 1 to 3,600 |" in text
    assert "| `poll_interval_s` | 1 | 0.01 to 60 |" in text
    assert "| `decrease_factor` | 0.5 | > 0 to < 1 |" in text


# -- types -------------------------------------------------------------------------


def test_a_boolean_is_not_a_number(tmp_path: Path) -> None:
    error = refused(tmp_path, source("max_concurrency = true"))
    assert (error.field, error.message) == (
        "sources.a.max_concurrency",
        "Input should be a valid integer",
    )


def test_text_is_not_a_boolean(tmp_path: Path) -> None:
    error = refused(tmp_path, 'include_bodies = "yes"\n')
    assert (error.field, error.message) == ("include_bodies", "Input should be a valid boolean")


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        (source('timeout_s = "30"'), "sources.a.timeout_s"),
        (source('max_concurrency = "4"'), "sources.a.max_concurrency"),
        ('[deferral]\njitter = "0.5"\n', "deferral.jitter"),
    ],
)
def test_numeric_text_is_not_a_number(tmp_path: Path, toml: str, field: str) -> None:
    assert refused(tmp_path, toml).field == field


def test_a_fraction_is_not_a_whole_number(tmp_path: Path) -> None:
    assert refused(tmp_path, source("max_concurrency = 2.5")).field == "sources.a.max_concurrency"


def test_typed_values_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(
        "include_bodies = true\n" + source("timeout_s = 30\nmax_concurrency = 4"), encoding="utf-8"
    )
    config = load_config(path)
    assert (config.include_bodies, config.sources["a"].timeout_s) == (True, 30.0)
    assert config.sources["a"].max_concurrency == 4


def test_a_key_file_path_is_text_in_the_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-test\n", encoding="utf-8")
    config = parse_config({"sources": {"a": {"api_key_file": str(key)}}})
    assert config.sources["a"].key is not None


def test_a_loaded_configuration_validates_again() -> None:
    config: Any = parse_config({"sources": {"a": {"timeout_s": 30}}})
    assert GatewayConfig.model_validate(config.model_dump()).sources["a"].timeout_s == 30.0


# -- "did you mean" ----------------------------------------------------------------


def test_a_near_miss_key_in_the_file_is_named_with_the_key_meant(tmp_path: Path) -> None:
    error = refused(tmp_path, scope("stal_window_s = 60"))
    assert error.field == "scopes.s.stal_window_s"
    assert error.message == "unknown setting; did you mean 'stall_window_s'?"


def test_a_near_miss_table_in_the_file_is_named_with_the_table_meant(tmp_path: Path) -> None:
    error = refused(tmp_path, '[stor]\nredis_url = "redis://h/0"\n')
    assert (error.field, error.message) == ("stor", "unknown setting; did you mean 'store'?")


def test_a_key_far_from_any_is_only_unknown(tmp_path: Path) -> None:
    assert refused(tmp_path, source("zzz = 1")).message == "unknown setting"
