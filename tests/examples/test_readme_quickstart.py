"""The examples that call real endpoints run as written. The README's quick start: its
`tasks.py` and `polygate.toml` blocks are written to a directory as they are, and its two
commands run there (a real `celery worker` on Redis, then the client line); the getting
started page holds the same blocks. The Gateway how-to's program that reads a
`polygate.toml`. Both against the simulated provider serving the models the
configuration names; only the environment differs: ``POLYGATE_*`` overrides point the
store and the sources at the test's Redis and simulator, as the pages say they may."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.conftest import own_redis

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
GATEWAY = ROOT / "docs" / "how-to" / "gateway.md"


def quickstart_blocks(heading: str = "## Quick start", page: Path = README) -> dict[str, str]:
    """A page section's code blocks: by the file named on their first line, else by
    their language ("sh", "python")."""
    text = page.read_text()
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, str] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S):
        first = body.splitlines()[0]
        named = re.match(r"#\s*(\S+\.(?:py|toml))$", first)
        blocks.setdefault(named.group(1) if named else lang, body)  # the first of each
    return blocks


@pytest.fixture
def quickstart_redis() -> Iterator[str]:
    with own_redis() as url:
        yield url


def test_the_quick_start_runs_as_written(quickstart_redis: str, tmp_path: Path) -> None:
    blocks = quickstart_blocks()
    assert {"tasks.py", "polygate.toml", "sh"} <= blocks.keys(), blocks.keys()
    (tmp_path / "tasks.py").write_text(blocks["tasks.py"])
    (tmp_path / "polygate.toml").write_text(blocks["polygate.toml"])
    worker_line, client_line = blocks["sh"].strip().splitlines()
    models = re.findall(r'^model = "([^"]+)"', blocks["polygate.toml"], flags=re.M)
    with SimulatedProvider(dict.fromkeys(models, ModelBehaviour(reply="a summary"))) as sim:
        env = {
            **os.environ,
            "POLYGATE_STORE__REDIS_URL": quickstart_redis,
            "POLYGATE_SOURCES__VLLM__BASE_URL": sim.url,
            "POLYGATE_SOURCES__HOSTED__BASE_URL": sim.url,
            "OPENAI_API_KEY": "sk-quickstart-not-a-real-key",
        }
        bin_dir = Path(sys.executable).parent
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"  # `celery` and `python`
        worker = subprocess.Popen(
            shlex.split(worker_line), cwd=tmp_path, env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            client = subprocess.run(
                shlex.split(client_line), cwd=tmp_path, env=env, capture_output=True,
                text=True, timeout=120, check=False,
            )  # fmt: skip
        finally:
            worker.terminate()
            log, _ = worker.communicate(timeout=60)
        served = [e.model for e in sim.journal if e.outcome == "ok"]
    assert client.returncode == 0, (client.stderr[-3000:], log.decode()[-3000:])
    assert client.stdout.strip() == "a summary"
    assert served == [models[0]]  # the first source in the scope's order


def test_the_getting_started_quick_start_is_the_readmes() -> None:
    """Its blocks say the test above runs them: so they must be the README's."""
    assert quickstart_blocks(page=GETTING_STARTED) == quickstart_blocks()


def test_the_gateway_from_a_file_runs_as_written(tmp_path: Path) -> None:
    """The Gateway how-to's "From a configuration file": its polygate.toml and program."""
    blocks = quickstart_blocks("## From a configuration file", GATEWAY)
    (tmp_path / "polygate.toml").write_text(blocks["polygate.toml"])
    (tmp_path / "main.py").write_text(blocks["python"])
    models = re.findall(r'^model = "([^"]+)"', blocks["polygate.toml"], flags=re.M)
    with SimulatedProvider(dict.fromkeys(models, ModelBehaviour(reply="a summary"))) as sim:
        env = {
            **os.environ,
            "POLYGATE_SOURCES__VLLM__BASE_URL": sim.url,
            "POLYGATE_SOURCES__HOSTED__BASE_URL": sim.url,
            "OPENAI_API_KEY": "sk-readme-not-a-real-key",
        }
        done = subprocess.run(
            [sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"a summary vllm {models[0]} 1"), done.stdout
