"""Configuration: TOML, POLYGATE_* environment, defaults, rules and secrets."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from polygate_celery.config import GatewayConfig, load_config, parse_config
from polygate_celery.errors import ConfigError
from polygate_celery.governance.plan import source_terms

SECRET = "sk-live-0123456789abcdef"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No POLYGATE_* variable of the machine leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("POLYGATE_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "polygate.toml"
    path.write_text(text, encoding="utf-8")
    return path


def one_scope(defined: dict[str, Any] | None = None, **scope: Any) -> dict[str, Any]:
    """Sources `defined` (default: one, "a") and one scope "x" over them."""
    defined = defined if defined is not None else {"a": {}}
    scope.setdefault("kind", "chat")
    scope.setdefault("sources", list(defined))
    return {"sources": defined, "scopes": {"x": scope}}


def field_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.field


TOML = """
[source_defaults]
timeout_s = 30

[source_defaults.breaker]
cooldown_s = 10

[scope_defaults]
max_attempts = 5

[sources.a]
base_url = "http://vllm:8000/v1"
model = "qwen"
max_concurrency = 4

[sources.a.breaker]
failure_threshold = 2

[sources.b]
timeout_s = 90
quota = "shared"

[quotas.shared]
rpm = 600

[scopes.s]
kind = "chat"
sources = ["a", "b"]
stall_window_s = 120
"""


def test_load_toml_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, TOML))
    assert isinstance(config, GatewayConfig)
    a, b, s = config.sources["a"], config.sources["b"], config.scopes["s"]
    assert a.base_url == "http://vllm:8000/v1"
    assert a.max_concurrency == 4
    assert a.timeout_s == 30.0  # from source_defaults
    assert b.timeout_s == 90.0  # the entry wins over the defaults
    assert config.quotas["shared"].rpm == 600
    assert s.sources == ["a", "b"]
    assert s.stall_window_s == 120.0
    assert s.max_attempts == 5  # from scope_defaults
    assert s.backoff_base_s == 2.0  # built-in default


def test_nested_defaults_merge_with_the_entry(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, TOML))
    a, b = config.sources["a"].breaker, config.sources["b"].breaker
    assert (a.failure_threshold, a.cooldown_s, a.auth_cooldown_s) == (2, 10.0, 600.0)
    assert (b.failure_threshold, b.cooldown_s) == (5, 10.0)


def test_config_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_CONFIG", str(write(tmp_path, TOML)))
    assert load_config().scopes["s"].stall_window_s == 120.0


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_SCOPES__S__STALL_WINDOW_S", "45")
    monkeypatch.setenv("POLYGATE_SOURCES__A__BREAKER__COOLDOWN_S", "7")
    monkeypatch.setenv("POLYGATE_SCOPE_DEFAULTS__BACKOFF_MAX_S", "20")
    config = load_config(write(tmp_path, TOML))
    assert config.scopes["s"].stall_window_s == 45.0
    assert config.scopes["s"].backoff_max_s == 20.0
    assert config.scopes["s"].sources == ["a", "b"]  # the rest of the file's table stays
    assert config.sources["a"].breaker.cooldown_s == 7.0
    assert config.sources["a"].breaker.failure_threshold == 2


def test_keyword_overrides_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_SOURCES__A__TIMEOUT_S", "5")
    config = load_config(sources={"a": {"timeout_s": 9}})
    assert config.sources["a"].timeout_s == 9.0


def test_environment_alone_is_a_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_SOURCES__A__MODEL", "m")
    monkeypatch.setenv("POLYGATE_SCOPES__S__KIND", "embedding")
    monkeypatch.setenv("POLYGATE_SCOPES__S__SOURCES", '["a"]')
    monkeypatch.setenv("POLYGATE_QUOTAS__Q__TPM", "100000")
    config = load_config()
    assert config.scopes["s"].kind == "embedding"
    assert config.sources["a"].model == "m"
    assert config.quotas["q"].tpm == 100_000


def test_no_file_no_environment_is_empty() -> None:
    config = load_config()
    assert (config.sources, config.quotas, config.scopes) == ({}, {}, {})


def test_scope_defaults_apply_to_every_scope() -> None:
    config = parse_config(
        {
            "scope_defaults": {"max_attempts": 4, "rate_limit_exempt": True},
            "sources": {"a": {}},
            "scopes": {
                "x": {"kind": "ocr", "sources": ["a"]},
                "y": {"kind": "ocr", "sources": ["a"], "max_attempts": 1},
            },
        }
    )
    assert config.scopes["x"].max_attempts == 4
    assert config.scopes["x"].rate_limit_exempt is True
    assert config.scopes["y"].max_attempts == 1


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (one_scope(stall_window_s=-1), "scopes.x.stall_window_s"),
        (one_scope(max_attempts=0), "scopes.x.max_attempts"),
        (one_scope(kind="image"), "scopes.x.kind"),
        (one_scope(sources=["a", "b"]), "scopes.x.sources.1"),
        (one_scope(backoff_base_s=10, backoff_max_s=5), "scopes.x.backoff_max_s"),
        (one_scope(bogus=1), "scopes.x.bogus"),
        ({"sources": {"a": {"bogus": 1}}}, "sources.a.bogus"),
        ({"bogus": 1}, "bogus"),
        ({"sources": {"a": {"quota": "nope"}}}, "sources.a.quota"),
        ({"sources": {"a": {"breaker": {"cooldown_s": 0}}}}, "sources.a.breaker.cooldown_s"),
        ({"scope_defaults": {"stall_window_s": 0}}, "scope_defaults.stall_window_s"),
    ],
    ids=[
        "negative-stall-window",
        "zero-max-attempts",
        "unknown-kind",
        "unknown-source",
        "backoff-max-below-base",
        "extra-scope-field",
        "extra-source-field",
        "extra-top-field",
        "unknown-quota",
        "nested-breaker",
        "scope-defaults",
    ],
)
def test_config_error_names_the_field(data: dict[str, Any], field: str) -> None:
    assert field_of(data) == field


def test_config_error_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(one_scope(max_attempts=0, stall_window_s=-1))
    paths = {path for path, _ in info.value.problems}
    assert paths == {"scopes.x.max_attempts", "scopes.x.stall_window_s"}


def test_ttft_rule_rejects_a_stall_window_below_the_largest_ttft() -> None:
    data = one_scope(
        {"a": {"ttft_timeout_s": 20}, "b": {"ttft_timeout_s": 50}, "c": {}}, stall_window_s=40
    )
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.field == "scopes.x.stall_window_s"
    assert "50" in str(info.value)


def test_ttft_rule_accepts_equality() -> None:
    parse_config(one_scope({"a": {"ttft_timeout_s": 50}}, stall_window_s=50))


def test_timeout_above_the_stall_window_is_accepted() -> None:
    # SPEC §3 rule 5: no configuration-time rule couples timeout_s to stall_window_s.
    config = parse_config(one_scope({"a": {"timeout_s": 300}}, stall_window_s=10))
    assert (config.sources["a"].timeout_s, config.scopes["x"].stall_window_s) == (300, 10)
    assert config.max_call_s("x") == 3 * 300 + 2 * 10  # the call's deadline makes room for both


def test_unreadable_toml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.toml")
    assert info.value.field == "<file>"
    assert "cannot read" in str(info.value)


def test_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, f'[sources.a]\napi_key = "{SECRET}"\nthis is = = bad\n'))
    assert info.value.field == "<file>"
    assert "not valid TOML" in str(info.value)
    assert SECRET not in str(info.value)


def test_api_key_env_unset_fails_at_load(tmp_path: Path) -> None:
    path = write(tmp_path, '[sources.x]\napi_key_env = "POLYGATE_TEST_UNSET_KEY"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == "sources.x.api_key_env"
    assert "POLYGATE_TEST_UNSET_KEY" in str(info.value)


def test_api_key_env_resolves_into_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_KEY_FOR_TEST", SECRET)
    source = parse_config({"sources": {"a": {"api_key_env": "OPENAI_KEY_FOR_TEST"}}}).sources["a"]
    assert isinstance(source.key, SecretStr)
    assert source.key.get_secret_value() == SECRET
    assert type(source).model_validate(source.model_dump()).key == source.key  # re-validates


def test_api_key_file_resolves_into_key(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(f"{SECRET}\n", encoding="utf-8")
    source = parse_config({"sources": {"a": {"api_key_file": str(key_file)}}}).sources["a"]
    assert isinstance(source.key, SecretStr)
    assert source.key.get_secret_value() == SECRET
    assert type(source).model_validate(source.model_dump()).key == source.key  # re-validates


@pytest.mark.parametrize("content", [None, ""], ids=["missing", "empty"])
def test_api_key_file_must_be_readable_and_non_empty(tmp_path: Path, content: str | None) -> None:
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content, encoding="utf-8")
    assert field_of({"sources": {"a": {"api_key_file": str(key_file)}}}) == "sources.a.api_key_file"


def test_only_one_key_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_KEY_FOR_TEST", SECRET)
    data = {"sources": {"a": {"api_key": SECRET, "api_key_env": "OPENAI_KEY_FOR_TEST"}}}
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.field == "sources.a"
    assert SECRET not in str(info.value)


def test_key_never_appears_in_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_SOURCES__A__API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_KEY_FOR_TEST", SECRET)
    config = load_config(sources={"b": {"api_key_env": "OPENAI_KEY_FOR_TEST"}})
    assert config.sources["a"].key is not None
    assert config.sources["a"].key.get_secret_value() == SECRET
    for text in (repr(config), str(config), config.model_dump_json()):
        assert SECRET not in text


def test_key_never_appears_in_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_SOURCES__A__API_KEY", SECRET)
    monkeypatch.setenv("POLYGATE_SOURCES__A__QUOTA", SECRET.lower())
    monkeypatch.setenv("POLYGATE_SOURCES__A__RPM", SECRET)
    with pytest.raises(ConfigError) as info:
        load_config()
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)
    assert all(SECRET not in msg for _, msg in info.value.problems)


def test_private_and_shared_quota_are_exclusive() -> None:
    data = {"quotas": {"q": {"rpm": 10}}, "sources": {"a": {"rpm": 5, "quota": "q"}}}
    assert field_of(data) == "sources.a"


def test_the_rpm_window_is_learned_unless_one_is_declared() -> None:
    data = one_scope({"a": {"rpm": 5}, "b": {"quota": "key"}, "c": {"rpm": 5}, "d": {"rpm": 5}})
    data["quotas"] = {"key": {"rpm": 10, "rpm_window": "sliding"}}
    data["sources"]["c"]["rpm_window"] = "sliding"
    data["sources"]["d"]["rpm_window"] = "bucket"
    config = parse_config(data)
    windows = {name: source_terms(config, name).quota for name in ("a", "b", "c", "d")}
    assert {name: q.rpm_window for name, q in windows.items() if q} == {
        "a": None,  # a bucket, or the provider's windows once its answers show them
        "b": "sliding",
        "c": "sliding",
        "d": "bucket",
    }
    assert field_of({"quotas": {"key": {"rpm": 10, "rpm_window": "fixed"}}}) == (
        "quotas.key.rpm_window"
    )


def test_an_rpm_window_without_its_own_rpm_is_refused() -> None:
    shared = {"quotas": {"key": {"rpm": 10}}}
    assert field_of({**shared, "sources": {"a": {"quota": "key", "rpm_window": "sliding"}}}) == (
        "sources.a"
    )
    assert field_of({"sources": {"a": {"tpm": 100, "rpm_window": "sliding"}}}) == "sources.a"
    assert field_of({"quotas": {"key": {"tpm": 100, "rpm_window": "sliding"}}}) == "quotas.key"


def test_max_call_s_default() -> None:
    config = parse_config(
        one_scope(
            {"a": {"timeout_s": 60}, "b": {"timeout_s": 90}}, max_attempts=4, stall_window_s=100
        )
    )
    assert config.max_call_s("x") == 4 * 90 + 2 * 100


def test_max_call_s_default_with_built_in_defaults() -> None:
    assert parse_config(one_scope()).max_call_s("x") == 3 * 60 + 2 * 300


def test_max_call_s_set_explicitly_wins() -> None:
    assert parse_config(one_scope(max_call_s=42)).max_call_s("x") == 42.0


def test_unparseable_environment_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYGATE_SCOPES", "not json")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert info.value.field == "scopes"


def test_retry_after_cap_below_poll_interval_is_rejected() -> None:
    data = {
        "sources": {"a": {}},
        "scopes": {
            "x": {"kind": "chat", "sources": ["a"], "poll_interval_s": 5, "retry_after_cap_s": 2}
        },
    }
    assert field_of(data) == "scopes.x.retry_after_cap_s"


def test_store_settings_load_from_the_environment_with_the_url_kept_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POLYGATE_STORE__REDIS_URL", "redis://:hunter2@redis:6379/0")
    monkeypatch.setenv("POLYGATE_STORE__LEASE_S", "5")
    config = load_config()
    assert config.store.redis_url is not None
    assert config.store.redis_url.get_secret_value() == "redis://:hunter2@redis:6379/0"
    assert config.store.lease_s == 5.0
    assert "hunter2" not in repr(config) + config.model_dump_json()
