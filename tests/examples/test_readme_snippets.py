"""The README's shorter code blocks run as written too (the quick start and the async
Gateway are in `test_readme_quickstart.py`): every Python block is accounted for here."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from polygate_celery.store.redis import RedisStore
from polygate_celery.testing.simulator import SimulatedProvider
from tests.examples.test_readme_quickstart import quickstart_blocks

ROOT = Path(__file__).resolve().parents[2]

SCOPE = """
[sources.vllm]
base_url = "http://127.0.0.1:9/v1"
model = "m"

[scopes.summarise]
kind = "chat"
sources = ["vllm"]
"""


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_the_fleet_wide_store_block_runs_as_written(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = quickstart_blocks("## Fleet-wide: the Redis store")["python"]
    (tmp_path / "polygate.toml").write_text(f'[store]\nredis_url = "{redis_url}"\n{SCOPE}')
    monkeypatch.chdir(tmp_path)
    names: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), names)
    gateway, store = names["gateway"], names["store"]
    assert isinstance(store, RedisStore)
    assert isinstance(gateway.store, RedisStore)  # type: ignore[attr-defined]

    async def use_and_close() -> None:
        assert await gateway.store.client.ping()  # type: ignore[attr-defined]
        await gateway.aclose()  # type: ignore[attr-defined]
        await store.aclose()

    asyncio.run(use_and_close())


def test_the_simulator_block_runs_as_written() -> None:
    code = quickstart_blocks("### A simulated provider")["python"]
    names: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), names)  # starts and stops the simulator
    assert isinstance(names["provider"], SimulatedProvider)


def test_the_testing_block_is_the_example_projects_test() -> None:
    """Run by `tests/packaging/` in a fresh virtualenv, with the example project."""
    code = quickstart_blocks("## Testing your tasks")["python"]
    assert code in (ROOT / "examples/testing/test_tasks.py").read_text()


def test_every_python_block_of_the_readme_is_run_by_a_test() -> None:
    covered = [
        *quickstart_blocks("## Quick start").values(),
        *quickstart_blocks("## Without Celery: the async Gateway").values(),
        quickstart_blocks("## Fleet-wide: the Redis store")["python"],
        quickstart_blocks("### A simulated provider")["python"],
        quickstart_blocks("## Testing your tasks")["python"],
    ]
    assert [block for block in python_blocks() if block not in covered] == []
