"""`polygate-celery check-config FILE`: the effective configuration, worker settings, warnings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polygate_celery.cli.config_warnings import config_warnings
from polygate_celery.config import parse_config
from tests.unit.cli.conftest import PASSWORD, SECRET_KEY, SOURCES, Cli, write


def test_a_valid_configuration_is_shown_resolved(cli: Cli, local_config: str) -> None:
    ran = cli("check-config", local_config)
    assert ran.code == 0
    assert ran.err == ""
    out = ran.out
    assert f"# {local_config}: valid." in out
    for section in ("[store]", "[deferral]", "[sources.vllm]", "[sources.hosted]"):
        assert f"\n{section}\n" in out
    for section in ("[sources.embedder]", "[quotas.provider]", "[scopes.summarise]"):
        assert f"\n{section}\n" in out
    assert "# redis_url" in out
    assert "in-memory store: one process only" in out
    # Derived and defaulted values are shown resolved, with where they come from.
    assert re.search(r"\nmax_call_s +=\ 780.0  # derived", out)  # 3 x 60 + 2 x 300
    assert "aimd.initial_limit        = 4  # unset: the cap" in out
    assert re.search(r"\nrate_limit_exempt += true  # the default for chat", out)
    assert 'quota                     = "provider"  # shared: rpm 90' in out
    assert 'api_key                   = "***"  # redacted' in out


def test_the_worker_settings_are_computed_without_a_broker(cli: Cli, local_config: str) -> None:
    redis = ["--broker", "redis://:pw-9d1e@127.0.0.1:6379/0"]
    out = cli("check-config", local_config, "--calls-per-task", "2", *redis).out
    assert "[worker]  # what configure_worker(app, config, calls_per_task=2) sets" in out
    assert "for broker redis://:***@127.0.0.1:6379/0" in out
    # The worst scope as a governed task runs it: 3 attempts x 60 s + 2 x 60 s (the window
    # governed tasks take when it is unset) = 300 s; two calls and 60 s more.
    assert re.search(r"governed tasks' soft_time_limit +\= 660\.0  # each governed task", out)
    assert "task_soft_time_limit" not in out  # plain tasks keep Celery's (none)
    assert "task_acks_late" in out
    assert "broker_transport_options" in out
    assert "visibility_timeout" in out
    assert "pw-9d1e" not in out


def test_the_worker_settings_for_rabbitmq(cli: Cli, local_config: str) -> None:
    out = cli("check-config", local_config, "--broker", "amqp://guest:pw-9d1e@rabbit//").out
    assert "for broker amqp://guest:***@rabbit//" in out
    assert re.search(r"\nbroker_transport_options +\= \{ confirm_publish = true \}\n", out)
    assert "visibility_timeout" not in out
    assert "pw-9d1e" not in out
    # The worst scope as a governed task runs it, 300 s, six times: a hard limit of
    # 1,860 + 186 s > 1,800 s.
    six = ("check-config", local_config, "--broker", "amqp://rabbit//", "--calls-per-task", "6")
    refused = cli(*six)
    assert refused.code == 2
    assert "consumer_timeout_s: RabbitMQ's consumer_timeout (1800 s)" in refused.err
    raised = cli(*six, "--consumer-timeout-s", "3600")
    assert raised.code == 0


def test_each_warning_comes_with_its_explanation(cli: Cli, local_config: str) -> None:
    out = cli("check-config", local_config).out
    warnings = " ".join(out[out.index("warnings:") :].split())
    assert "- no Redis store: the in-memory store governs one process only" in warnings
    assert "- scope 'embed' has one source ('embedder') and no fallback" in warnings
    assert "- quota 'provider' is used by one source only ('hosted')" in warnings
    assert "N worker processes may send N times max_concurrency" in warnings


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            {"scopes": {"s": {"kind": "chat", "sources": ["a", "b"], "stall_window_s": 30}}},
            "stall_window_s (30 s) is below the largest timeout_s of its sources (60 s)",
        ),
        (
            {"scopes": {"s": {"kind": "chat", "sources": ["a", "b"], "max_call_s": 100}}},
            "max_call_s (100 s) is below max_attempts x timeout_s (3 x 60 = 180 s)",
        ),
        (
            {"sources": {"c": {"base_url": "http://x/v1"}}},
            "source 'c' has no model",
        ),
        (
            {"sources": {"c": {"model": "m"}}},
            "source 'c' is in no scope",
        ),
    ],
)
def test_warnings_for_what_is_allowed_but_probably_unmeant(
    extra: dict[str, dict[str, object]], expected: str
) -> None:
    data: dict[str, dict[str, object]] = {
        "store": {"redis_url": "redis://127.0.0.1:6379/0"},
        "sources": {n: {"base_url": "http://x/v1", "model": "m"} for n in ("a", "b")},
        "scopes": {"s": {"kind": "chat", "sources": ["a", "b"]}},
    }
    for table, entries in extra.items():
        data[table] = {**data[table], **entries}
    found = [advice.what for advice in config_warnings(parse_config(data))]
    assert any(expected in what for what in found), found
    if "stall_window_s" in expected:
        why = next(a.why for a in config_warnings(parse_config(data)) if expected in a.what)
        assert "a timeout never causes a stall verdict" in why


def test_a_clean_configuration_has_no_warnings(cli: Cli, tmp_path: Path) -> None:
    path = write(
        tmp_path / "clean.toml",
        """
[store]
redis_url = "redis://127.0.0.1:1/0"
[sources.a]
base_url = "http://x/v1"
model = "m"
[sources.b]
base_url = "http://y/v1"
model = "m"
[scopes.s]
kind = "chat"
sources = ["a", "b"]
""",
    )
    ran = cli("check-config", path)  # connects nowhere: port 1 is never tried
    assert (ran.code, ran.out.rstrip().splitlines()[-1]) == (0, "no warnings")


def test_an_invalid_configuration_names_the_field(cli: Cli, tmp_path: Path) -> None:
    path = write(
        tmp_path / "bad.toml", SOURCES.replace('sources = ["embedder"]', 'sources = ["x"]')
    )
    line = cli("check-config", path).error_line
    assert line == "error: invalid configuration: scopes.embed.sources.0: no source named 'x'"


def test_every_problem_is_on_the_one_line(cli: Cli, tmp_path: Path) -> None:
    bad = "[sources.a]\ntimeout_s = -1\nmax_concurrency = 0\n"
    line = cli("check-config", write(tmp_path / "bad.toml", bad)).error_line
    assert "sources.a.timeout_s: " in line
    assert "sources.a.max_concurrency: " in line


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "cannot read"), ("x = [", "is not valid TOML")],
)
def test_an_unreadable_file_is_one_line(
    cli: Cli, tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "c.toml"
    if content is not None:
        path.write_text(content)
    assert expected in cli("check-config", str(path)).error_line


def test_a_bad_calls_per_task_is_a_usage_error(cli: Cli, local_config: str) -> None:
    line = cli("check-config", local_config, "--calls-per-task", "0").error_line
    assert "--calls-per-task: '0': must be at least 1" in line


def test_no_secret_is_printed(cli: Cli, tmp_path: Path) -> None:
    store = f'[store]\nredis_url = "redis://user:{PASSWORD}@127.0.0.1:1/0?password={PASSWORD}"\n'
    ran = cli("check-config", write(tmp_path / "secret.toml", store + SOURCES))
    assert ran.code == 0
    lines = [" ".join(line.split()) for line in ran.out.splitlines()]  # columns vary
    assert 'redis_url = "redis://user:***@127.0.0.1:1/0?password=***"' in lines
    for secret in (SECRET_KEY, PASSWORD):
        assert secret not in ran.out + ran.err
