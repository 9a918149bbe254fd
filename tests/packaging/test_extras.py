"""Every extra works alone: the built wheel, installed with one extra into a fresh
virtualenv (nothing from the dev environment), does what the extra is for.

`uv` builds the wheel and makes the virtualenvs (its cache keeps this to seconds an
extra after the first run); each check runs in its virtualenv from a scratch directory,
so the repository's sources cannot stand in for the installed package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import own_redis

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
# The demo extra's virtualenv made here measured 62 MB, 48 packages (CPython 3.11, x86_64
# Linux; uv: no pip, no bytecode); `make demo`'s (pip), 118 MB; the development install's,
# 614 MB. The bound leaves room for the dependencies' releases to grow.
DEMO_INSTALL_MAX_BYTES = 120_000_000


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        pytest.fail("uv is not installed: pip install 'polygate_celery[dev]'")
    return found


def run(command: list[str], cwd: Path, timeout: float = 600, **env: str) -> str:
    done = subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}",
            pytrace=False,
        )
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # The sdist first, then the wheel from it (uv's default): a wheel built straight from
    # the tree would take stale modules from setuptools' build/ directory too.
    run([uv(), "build", "--out-dir", str(out), str(ROOT)], ROOT)
    (built,) = out.glob("polygate_celery-*.whl")
    return built


def install(wheel: Path, extra: str, where: Path) -> Path:
    """A fresh virtualenv at `where` with the wheel and `extra` alone; its python."""
    venv = where / "venv"
    run([uv(), "venv", "--quiet", "--python", sys.executable, str(venv)], where)
    python = venv / "bin" / "python"
    spec = f"polygate_celery[{extra}] @ {wheel.as_uri()}" if extra else str(wheel)
    run([uv(), "pip", "install", "--quiet", "--python", str(python), spec], where)
    for script in HERE.glob("*.py"):
        if script.name != "__init__.py" and not script.name.startswith("test_"):
            shutil.copy(script, where / script.name)
    return python


@pytest.fixture
def smoke_broker() -> Iterator[str]:
    with own_redis() as url:
        yield url


def test_the_core_install_makes_governed_calls_and_names_the_extra_each_module_needs(
    wheel: Path, tmp_path: Path
) -> None:
    python = install(wheel, "", tmp_path)
    out = run([str(python), "smoke_core.py"], tmp_path)
    assert "governed call answered 'stub says hi'" in out
    assert "pip install 'polygate_celery[celery]'" in out
    cli = str(python.parent / "polygate-celery")
    assert "POLYGATE_STORE__REDIS_URL" in run([cli, "example", "env"], tmp_path)
    assert '"summariser"' in run([cli, "example", "models"], tmp_path)
    assert "[scopes.summarise]" in run([cli, "example", "config"], tmp_path)
    # A command whose extra is not installed: one line, exit status 2, no traceback.
    for command, says in (
        ([cli, "demo"], "error: the demo needs aiohttp: pip install 'polygate_celery[demo]'"),
        (
            [cli, "metrics"],
            "error: polygate-celery metrics needs prometheus_client, which is not installed: "
            "pip install 'polygate_celery[prometheus]'",
        ),
        (
            [str(python), "-m", "polygate_celery.metrics", "--help"],
            "error: polygate_celery.metrics needs prometheus-client: "
            "pip install 'polygate_celery[prometheus]'",
        ),
    ):
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", says + "\n"), command


def test_the_celery_extra_runs_a_governed_task_on_a_real_worker(
    wheel: Path, tmp_path: Path, smoke_broker: str
) -> None:
    python = install(wheel, "celery", tmp_path)
    queue, prefix = f"smoke-{uuid.uuid4().hex[:8]}", f"smoke-{uuid.uuid4().hex[:8]}"
    out = run([str(python), "smoke_celery.py", smoke_broker, queue, prefix], tmp_path)
    assert "governed task answered 'stub says hi'" in out


def test_the_openai_extra_calls_through_the_sdk_adapter(wheel: Path, tmp_path: Path) -> None:
    python = install(wheel, "openai", tmp_path)
    assert "answered 'stub says hi'" in run([str(python), "smoke_openai.py"], tmp_path)


def test_the_simulator_extra_serves_from_its_command_line(wheel: Path, tmp_path: Path) -> None:
    python = install(wheel, "simulator", tmp_path)
    assert "the simulator at http://" in run([str(python), "smoke_simulator.py"], tmp_path)


def test_the_prometheus_extra_renders_the_metrics(wheel: Path, tmp_path: Path) -> None:
    python = install(wheel, "prometheus", tmp_path)
    assert "prometheus metrics:" in run([str(python), "smoke_prometheus.py"], tmp_path)


def test_the_otel_extra_makes_spans_with_the_application_s_sdk(wheel: Path, tmp_path: Path) -> None:
    python = install(wheel, "otel", tmp_path)
    # The SDK is the application's to choose and set up: installed as a user would.
    run([uv(), "pip", "install", "--quiet", "--python", str(python), "opentelemetry-sdk"],
        tmp_path)  # fmt: skip
    out = run([str(python), "smoke_otel.py"], tmp_path)
    assert "otel spans: chat chat, chat stub" in out


def test_the_demo_extra_runs_the_demo_on_its_embedded_redis(wheel: Path, tmp_path: Path) -> None:
    """From the installed package alone (no clone): its example, its embedded Redis."""
    python = install(wheel, "demo", tmp_path)
    cli = python.parent / "polygate-celery"
    out = run(
        [str(cli), "demo", "--documents", "2", "--pages", "1", "--timeout", "240"],
        tmp_path,
        timeout=300,
        POLYGATE_REDIS_URL="",
    )
    assert "6 of 6 tasks accounted for" in out, out[-2000:]
    # What the demo needs and no more: no development tools, no plotting stack.
    installed = run([uv(), "pip", "list", "--python", str(python)], tmp_path).lower().split()
    for absent in ("pytest", "mypy", "ruff", "mutmut", "mkdocs", "matplotlib", "numpy"):
        assert absent not in installed, absent
    size = sum(f.stat().st_size for f in (tmp_path / "venv").rglob("*") if f.is_file())
    assert size < DEMO_INSTALL_MAX_BYTES, f"{size / 1e6:.0f} MB"


def test_a_user_project_tests_its_governed_tasks_with_the_plugin_and_pytest_celery(
    wheel: Path, tmp_path: Path, redis_url: str
) -> None:
    """`examples/testing`, as a user runs it: the celery extra, pytest and pytest-celery
    (whose Docker fixtures go unused) in a fresh virtualenv; the plugin loads by itself."""
    python = install(wheel, "celery", tmp_path)
    run([uv(), "pip", "install", "--quiet", "--python", str(python), "pytest", "pytest-celery"],
        tmp_path)  # fmt: skip
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples" / "testing", project)
    with own_redis() as url:
        out = run(
            [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "."],
            project,
            POLYGATE_TEST_REDIS_URL=url,
        )
    assert "3 passed" in out, out[-3000:]
    plugins = run([str(python), "-m", "pytest", "--version", "--version"], project)
    assert "pytest-celery" in plugins  # installed and registered beside the plugin
    assert "polygate_celery" in plugins


def test_the_bench_extra_brings_what_the_benchmarks_import(wheel: Path, tmp_path: Path) -> None:
    python = install(wheel, "bench", tmp_path)
    check = (
        "import matplotlib, openai, polygate_celery.celery, polygate_celery.sources.sdk, "
        "polygate_celery.testing.simulator.server; print('bench imports')"
    )
    assert "bench imports" in run([str(python), "-c", check], tmp_path)
