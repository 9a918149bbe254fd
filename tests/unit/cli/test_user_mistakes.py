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
    assert "needs store.redis_url: the in-memory store lives inside one process" in line


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


@pytest.mark.parametrize("command", FLEET_COMMANDS)
def test_a_missing_configuration_file_is_named(
    cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    line = cli(*command, "--config", str(tmp_path / "nowhere.toml")).error_line
    assert "cannot read" in line
    assert "nowhere.toml" in line


def test_no_configuration_at_all(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLYGATE_CONFIG", raising=False)
    line = cli("status").error_line
    assert line == "error: no configuration: give --config FILE or set POLYGATE_CONFIG"


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
        ["check-config"],
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
    assert process.wait(timeout=30) == 141
    assert err == b""
