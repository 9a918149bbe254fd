"""A broker URL that does not parse is refused by name; no part of its password is printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.cli.conftest import Cli

BROKER_PASSWORD = "BRKq7Zx9Wv"  # distinctive, so that any fragment of it is noticed
# A '#' unescaped in the password: kombu reads "BRKq7Zx9Wv" as the port, and says so.
UNPARSED = f"redis://:{BROKER_PASSWORD}#@%:7@broker/0"


def fragments(secret: str, length: int = 4) -> set[str]:
    return {secret[i : i + length] for i in range(len(secret) - length + 1)}


def assert_no_part_of_the_password(text: str) -> None:
    leaked = {part for part in fragments(BROKER_PASSWORD) if part in text}
    assert not leaked, f"part of the password printed: {sorted(leaked)}"


def test_check_config_refuses_an_unparsed_broker_url_by_name(cli: Cli, local_config: str) -> None:
    ran = cli("check-config", local_config, "--broker", UNPARSED)
    line = ran.error_line
    assert line.startswith("error: invalid configuration: broker_url: the URL does not parse")
    assert "%23" in line  # what to write instead
    assert_no_part_of_the_password(ran.out + ran.err)


def test_the_broker_from_the_environment_is_checked_too(
    cli: Cli, local_config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", f"amqp://guest:{BROKER_PASSWORD}#x@rabbit//")
    ran = cli("check-config", local_config)
    assert "broker_url: the URL does not parse" in ran.error_line
    assert_no_part_of_the_password(ran.out + ran.err)


def test_a_transport_kombu_does_not_know_is_one_line(cli: Cli, local_config: str) -> None:
    ran = cli("check-config", local_config, "--broker", f"nosuch://u:{BROKER_PASSWORD}@h/0")
    assert "broker_url: kombu cannot use it (scheme 'nosuch'" in ran.error_line
    assert_no_part_of_the_password(ran.out + ran.err)


def test_the_command_prints_no_traceback_and_no_secret(local_config: str) -> None:
    """As a user runs it: the whole of stdout and stderr of the console script."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("POLYGATE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    argv = ["check-config", local_config, "--broker", UNPARSED]
    # No timeout: it polls with real sleeps, which unit tests refuse (pytest's own ends a hang).
    process = subprocess.Popen(
        [sys.executable, "-m", "polygate_celery", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    out, err = process.communicate()
    assert process.returncode == 2
    assert "Traceback" not in err
    assert "broker_url" in err
    assert_no_part_of_the_password(out + err)
