"""Where the commands find their configuration, what they need of it, and which broker
`check-config` computes the worker settings for (and that it says so)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polygate_celery.config import load_config
from polygate_celery.config.models import without_api_keys
from polygate_celery.errors import ConfigError
from tests.unit.cli.conftest import SECRET_KEY, SOURCES, Cli, Fleet, write

KEYS_ELSEWHERE = """
[sources.from_env]
base_url = "http://127.0.0.1:9/v1"
model = "m"
api_key_env = "POLYGATE_TEST_UNSET_KEY"

[sources.from_file]
base_url = "http://127.0.0.1:9/v1"
model = "m"
api_key_file = "/nonexistent/polygate-test/key"

[scopes.elsewhere]
kind = "chat"
sources = ["from_env", "from_file"]
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory of the test's own, with no $POLYGATE_CONFIG."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("POLYGATE_CONFIG", raising=False)
    monkeypatch.delenv("POLYGATE_TEST_UNSET_KEY", raising=False)
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    return work


def test_status_reads_the_polygate_toml_of_the_working_directory(
    cli: Cli, fleet: Fleet, here: Path
) -> None:
    write(here / "polygate.toml", Path(fleet.path).read_text(encoding="utf-8"))
    ran = cli("status")
    assert (ran.code, ran.err) == (0, "")
    assert f"prefix {fleet.prefix}" in ran.out


def test_the_file_named_wins_over_the_working_directory(
    cli: Cli, fleet: Fleet, here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(here / "polygate.toml", SOURCES)  # in-memory store: status would refuse it
    assert cli("status", "--config", fleet.path).code == 0
    monkeypatch.setenv("POLYGATE_CONFIG", fleet.path)
    assert cli("status").code == 0


def test_status_and_source_run_without_the_sources_api_keys(
    cli: Cli, fleet: Fleet, here: Path
) -> None:
    """They only read and write Redis: a key variable unset, a key file absent, no matter."""
    store = Path(fleet.path).read_text(encoding="utf-8").split("[sources.", 1)[0]
    path = write(here / "polygate.toml", store + KEYS_ELSEWHERE)
    ran = cli("status")
    assert (ran.code, ran.err) == (0, "")
    assert re.search(r"\n\s*elsewhere\s+from_env\s+0\s+8\s+8\s+closed", ran.out), ran.out
    assert cli("source", "pause", "from_file", "30").out.startswith("paused from_file fleet-wide")
    assert cli("source", "reset", "from_env", "--config", path).code == 0


def test_check_config_still_requires_the_keys_the_workers_need(cli: Cli, here: Path) -> None:
    write(here / "polygate.toml", KEYS_ELSEWHERE)
    line = cli("check-config").error_line
    assert "sources.from_env.api_key_env: environment variable 'POLYGATE_TEST_UNSET_KEY'" in line


def test_loading_without_keys_leaves_every_key_unread(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml", SOURCES + KEYS_ELSEWHERE.replace("[scopes.elsewhere]", "[scopes.x]")
    )
    with without_api_keys():
        config = load_config(path)
    assert all(source.key is None for source in config.sources.values())  # even hosted's
    with pytest.raises(ConfigError, match="POLYGATE_TEST_UNSET_KEY"):
        load_config(path)  # outside the block: read, and refused
    read = load_config(write(tmp_path / "d.toml", SOURCES))
    key = read.sources["hosted"].key
    assert key is not None
    assert key.get_secret_value() == SECRET_KEY


def test_check_config_reads_the_polygate_toml_of_the_working_directory(
    cli: Cli, here: Path
) -> None:
    write(here / "polygate.toml", SOURCES)
    ran = cli("check-config")
    assert ran.code == 0, ran
    assert ran.out.startswith("# polygate.toml: valid.")


def worker_note(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("[worker]")]
    return line


def test_check_config_computes_the_worker_for_the_stores_redis_and_says_so(
    cli: Cli, here: Path
) -> None:
    store = '[store]\nredis_url = "redis://:pw-51c2@redis.internal:6379/0"\n'
    write(here / "polygate.toml", store + SOURCES)
    ran = cli("check-config")
    assert ran.code == 0, ran
    note = worker_note(ran.out)
    assert note.endswith(
        "for broker redis://:***@redis.internal:6379/0 (assumed: the store's store.redis_url, "
        "as neither --broker nor $CELERY_BROKER_URL is given)"
    )
    assert "visibility_timeout" in ran.out  # Redis transport settings, not amqp's
    assert "pw-51c2" not in ran.out


def test_check_config_names_the_broker_it_was_given_or_found(
    cli: Cli, here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = '[store]\nredis_url = "redis://redis.internal:6379/0"\n'
    write(here / "polygate.toml", store + SOURCES)
    given = worker_note(cli("check-config", "--broker", "amqp://rabbit//").out)
    assert given.endswith("for broker amqp://rabbit// (--broker)")
    monkeypatch.setenv("CELERY_BROKER_URL", "amqp://guest:pw-77e0@rabbit//")
    found = cli("check-config").out
    assert worker_note(found).endswith("for broker amqp://guest:***@rabbit// ($CELERY_BROKER_URL)")
    assert "pw-77e0" not in found


def test_without_a_redis_store_check_config_assumes_celerys_default_and_says_so(
    cli: Cli, local_config: str, here: Path
) -> None:
    note = worker_note(cli("check-config", local_config).out)
    assert note.endswith(
        "for broker amqp:// (assumed: Celery's default, as neither --broker nor "
        "$CELERY_BROKER_URL is given and the store has no redis_url)"
    )


def test_a_store_url_kombu_cannot_take_is_not_the_users_mistake(cli: Cli, here: Path) -> None:
    """A store URL with ``?password=`` is fine for the store, not for kombu: the worker
    section falls back to Celery's default and says why."""
    store = '[store]\nredis_url = "redis://u:pw-0a9b@127.0.0.1:1/0?password=pw-0a9b"\n'
    write(here / "polygate.toml", store + SOURCES)
    ran = cli("check-config")
    assert ran.code == 0, ran
    assert worker_note(ran.out).endswith(
        "for broker amqp:// (assumed: Celery's default, as neither --broker nor "
        "$CELERY_BROKER_URL is given and kombu cannot take store.redis_url for a broker)"
    )
    assert "pw-0a9b" not in ran.out
