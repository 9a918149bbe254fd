"""Every user mistake is one `error:` line and exit status 2; no command prints a secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.cli.conftest import PASSWORD, SECRET_KEY, SOURCES, Cli, Fleet, with_password, write

FLEET_COMMANDS = [
    ["status"],
    ["status", "--watch", "1"],
    ["source", "pause", "hosted", "5"],
    ["source", "resume", "hosted"],
    ["source", "reset", "hosted"],
]


def store_config(tmp_path: Path, url: str) -> str:
    return write(tmp_path / "c.toml", f'[store]\nredis_url = "{url}"\n' + SOURCES)


@pytest.mark.parametrize("command", FLEET_COMMANDS)
def test_an_unreachable_redis_names_host_and_port_not_the_password(
    cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    path = store_config(tmp_path, f"redis://:{PASSWORD}@127.0.0.1:1/0")
    line = cli(*command, "--config", path).error_line
    assert line.startswith("error: cannot reach Redis at 127.0.0.1:1: ")
    assert PASSWORD not in line


def test_credentials_redis_refuses_are_named_without_the_password(
    cli: Cli, tmp_path: Path, redis_url: str
) -> None:
    url = with_password(redis_url).replace("://:", "://somebody:")  # no such ACL user
    line = cli("status", "--config", store_config(tmp_path, url)).error_line
    assert line.endswith("refused the credentials in store.redis_url")
    assert PASSWORD not in line


@pytest.mark.parametrize("command", FLEET_COMMANDS)
def test_fleet_commands_need_a_shared_store(
    cli: Cli, local_config: str, command: list[str]
) -> None:
    line = cli(*command, "--config", local_config).error_line
    assert "needs a Redis store (store.redis_url, store.sentinels or" in line
    assert "the in-memory store lives inside one process" in line


@pytest.mark.parametrize("command", [*FLEET_COMMANDS, ["check-config"]])
def test_an_invalid_configuration_names_its_field(
    cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    path = write(
        tmp_path / "bad.toml", SOURCES.replace("max_concurrency = 4", "max_concurrency = 0")
    )
    args = [*command, path] if command == ["check-config"] else [*command, "--config", path]
    line = cli(*args).error_line
    assert line.startswith("error: invalid configuration: sources.hosted.max_concurrency: ")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:6391", "the URL has no scheme"),
        ("sentinel://127.0.0.1:26379", "set store.sentinels and store.service_name instead"),
        ("redis+cluster://127.0.0.1:7000", "set store.cluster_nodes instead"),
        ("memcached://127.0.0.1:11211", "scheme 'memcached' is not one the store can use"),
        (f"redis://:{PASSWORD}#1@127.0.0.1:6379/0", "must be percent-encoded, e.g. '#' as %23"),
        ("redis://127.0.0.1:6379/zero", "the database must be a number"),
    ],
)
def test_a_redis_url_the_store_cannot_use_is_refused_at_load(
    cli: Cli, tmp_path: Path, url: str, says: str
) -> None:
    """check-config refuses it (a worker would start, then fail every task), in one line
    that names the field and shows the form to write, never the password."""
    line = cli("check-config", store_config(tmp_path, url)).error_line
    assert line.startswith("error: invalid configuration: store.redis_url: ")
    assert says in line
    assert "write redis://[:PASSWORD@]HOST:PORT/DB" in line or "%23" in line or "instead" in line
    assert PASSWORD not in line


def test_check_config_reads_POLYGATE_CONFIG_without_a_file(
    cli: Cli, local_config: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path / "..")  # no polygate.toml there
    monkeypatch.setenv("POLYGATE_CONFIG", local_config)
    ran = cli("check-config")
    assert ran.code == 0, ran
    assert ran.out.startswith(f"# {local_config}: valid.")
    monkeypatch.delenv("POLYGATE_CONFIG")
    assert cli("check-config").error_line == (
        "error: no configuration: give FILE, set POLYGATE_CONFIG, or run where polygate.toml "
        f"is (there is none in {tmp_path.parent})"
    )


@pytest.mark.parametrize("command", FLEET_COMMANDS)
def test_a_missing_configuration_file_is_named(
    cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    line = cli(*command, "--config", str(tmp_path / "nowhere.toml")).error_line
    assert "cannot read" in line
    assert "nowhere.toml" in line


@pytest.mark.parametrize("command", [*FLEET_COMMANDS, ["metrics"]])
def test_no_configuration_at_all(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("POLYGATE_CONFIG", raising=False)
    line = cli(*command).error_line
    assert line == (
        "error: no configuration: give --config FILE, set POLYGATE_CONFIG, or run where "
        f"polygate.toml is (there is none in {tmp_path})"
    )


def test_an_unknown_scope_is_named(cli: Cli, fleet: Fleet) -> None:
    line = cli("status", "--config", fleet.path, "--scope", "nope").error_line
    assert line == "error: unknown scope 'nope' (configured: embed, summarise)"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nonsense"],
        ["status", "--watch", "0"],
        ["status", "--bogus"],
        ["source"],
        ["source", "pause", "hosted"],
        ["check-config", "a.toml", "extra"],
    ],
)
def test_bad_arguments_are_one_line(cli: Cli, argv: list[str]) -> None:
    assert "(see: polygate-celery" in cli(*argv).error_line


def test_no_command_prints_a_secret(cli: Cli, fleet: Fleet, tmp_path: Path) -> None:
    """The fleet's URL carries a password the local Redis accepts; a source has an API key."""
    config = Path(fleet.path).read_text()
    assert PASSWORD in config
    assert SECRET_KEY in config
    printed = ""
    for argv in (
        ["status", "--config", fleet.path],
        ["source", "pause", "hosted", "5", "--config", fleet.path],
        ["source", "reset", "hosted", "--config", fleet.path],
        ["check-config", fleet.path],
    ):
        ran = cli(*argv)
        assert ran.code == 0, ran
        printed += ran.out + ran.err
    assert "redis_url" in printed
    assert "api_key" in printed
    assert PASSWORD not in printed
    assert SECRET_KEY not in printed


def test_a_reader_that_leaves_early_is_not_an_error() -> None:
    """`polygate-celery check-config FILE | head -1`: no BrokenPipeError traceback."""
    root = Path(__file__).resolve().parents[3]
    command = [sys.executable, "-m", "polygate_celery", "check-config"]
    process = subprocess.Popen(
        [*command, str(root / "examples/pipeline/polygate.toml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    assert process.stderr is not None
    process.stdout.close()  # before the command has written: its first write meets EPIPE
    err = process.stderr.read()
    process.stderr.close()
    # No timeout: Popen.wait(timeout) polls with real sleeps, which unit tests refuse; a
    # hang ends at pytest's own timeout.
    assert process.wait() == 141
    assert err == b""
