"""Every Python, TOML and shell block of the README and the manual runs, or says why not.

One test per page, its blocks in order in a scratch directory of its own (the
convention is in `tests.docs.code_blocks`); then the runner's own rules, on the
small pages under ``tests/docs/fixtures/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis

from polygate_celery.store.redis.keys import KeySpace
from tests.conftest import unique_prefix
from tests.docs.code_blocks import (
    DUMMY_KEY,
    PageError,
    block_environment,
    read_page,
    run_page,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

RunPage = Callable[..., list[object]]


@pytest.fixture
def run(redis_url: str, tmp_path: Path) -> Iterator[RunPage]:
    """Run a page as the docs tier does: its own scratch directory and key prefix, whose
    keys are deleted afterwards."""
    prefixes: list[str] = []

    def run_one(path: Path, timeout_s: float = 60.0) -> list[object]:
        page = read_page(path)
        prefix = unique_prefix()
        prefixes.append(prefix)
        scratch = tmp_path / path.stem
        scratch.mkdir()
        env = block_environment(redis_url, prefix, page.blocks)
        return list(run_page(page, scratch, env, timeout_s))

    yield run_one
    client = redis.Redis.from_url(redis_url)
    try:
        for prefix in prefixes:
            keys = list(client.scan_iter(match=KeySpace(prefix).pattern, count=1000))
            if keys:
                client.delete(*keys)
    finally:
        client.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_page_s_blocks_run(run: RunPage, path: Path) -> None:
    run(path)


# -- the runner's rules, on pages of its own -----------------------------------------------------


def fixture(name: str) -> Path:
    return FIXTURES / name


def test_file_blocks_are_written_and_blocks_run_in_order(run: RunPage) -> None:
    ran = run(fixture("files_and_order.md"))
    assert len(ran) == 6


def test_a_block_marked_not_run_is_skipped_with_its_reason(run: RunPage) -> None:
    page = read_page(fixture("not_run.md"))
    assert [b.skip_reason for b in page.blocks] == [
        "exits 1 on purpose",
        "starts something that runs until stopped",
        None,
    ]
    assert len(run(fixture("not_run.md"))) == 1


def test_output_blocks_are_not_run(run: RunPage) -> None:
    assert run(fixture("output.md")) == []


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("empty_reason.md", "a `not run` marker gives no reason"),
        ("misplaced_marker.md", "a `not run` marker must be right before a fence"),
        ("unknown_language.md", "a block in a language that is not run"),
        ("no_language.md", "no language"),
        ("unclosed.md", "a fence that is never closed"),
    ],
)
def test_a_page_that_breaks_the_convention_is_refused_before_anything_runs(
    run: RunPage, tmp_path: Path, name: str, message: str
) -> None:
    with pytest.raises(PageError, match=message):
        run(fixture(name))
    # Nothing ran: each of these pages' first block would have left a file.
    assert list((tmp_path / Path(name).stem).iterdir()) == []


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("failing_python.md", r"failing_python.md:5 \(python\): exit status 1"),
        ("failing_shell.md", r"failing_shell.md:7 \(sh\): exit status 3"),
        ("invalid_toml.md", r"invalid_toml.md:3 \(toml\): not valid TOML"),
        ("invalid_config.md", "not a valid configuration .*max_attempts"),
        ("invalid_yaml.md", r"invalid_yaml.md:3 \(yaml\): does not parse"),
    ],
)
def test_a_failing_block_fails_its_page_and_says_where(
    run: RunPage, name: str, message: str
) -> None:
    with pytest.raises(PageError, match=message):
        run(fixture(name))


def test_the_failure_shows_the_block_s_output(run: RunPage) -> None:
    with pytest.raises(PageError, match="ZeroDivisionError"):
        run(fixture("failing_python.md"))


def test_a_block_that_runs_too_long_is_stopped_with_what_it_started(
    run: RunPage, tmp_path: Path
) -> None:
    # 8 s: time enough for the block to start its background process even on a busy
    # machine (it must have, for the test to see that process stopped).
    with pytest.raises(PageError, match=r"still running after 8 s"):
        run(fixture("runs_forever.md"), timeout_s=8)
    pid = int((tmp_path / "runs_forever" / "background.pid").read_text())
    # Gone, or killed and not yet reaped; a busy machine may take a moment to end it.
    with contextlib.suppress(psutil.NoSuchProcess):
        process = psutil.Process(pid)
        with contextlib.suppress(psutil.TimeoutExpired):
            process.wait(timeout=20)
        assert process.status() == psutil.STATUS_ZOMBIE


def test_blocks_get_a_redis_under_their_own_prefix_and_no_real_key(
    run: RunPage, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-a-real-key-of-the-machine")
    monkeypatch.setenv("POLYGATE_CONFIG", "/nowhere.toml")
    run(fixture("environment.md"))


def test_a_dummy_key_is_given_only_for_the_variables_blocks_name() -> None:
    page = read_page(fixture("environment.md"))
    env = block_environment("redis://127.0.0.1:6379/0", "p", page.blocks)
    assert env["OPENAI_API_KEY"] == DUMMY_KEY
    assert "ANTHROPIC_API_KEY" not in env
    assert env["POLYGATE_STORE__KEY_PREFIX"] == "p"
