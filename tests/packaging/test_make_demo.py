"""`make demo` installs the demo extra alone; `make test` (and every other target) the
development tools; a development install, when there is one, runs the demo as it is.

Checked with ``make -n`` (what make would run, without running it) on a scratch
virtualenv path: nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def planned(target: str, venv: Path) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [make, "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_on_a_fresh_clone_make_demo_installs_the_demo_extra_alone(tmp_path: Path) -> None:
    plan = planned("demo", tmp_path / "venv")
    assert "-m venv" in plan
    assert "pip install --quiet -e '.[demo]'" in plan
    assert ".[dev]" not in plan
    assert plan.rstrip().endswith(f"{tmp_path}/venv/bin/polygate-celery demo")


def test_make_test_installs_the_development_tools_even_after_the_demo(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "bin" / ".installed-demo").touch()  # `make demo` ran first
    plan = planned("test", venv)
    assert "-m venv" not in plan  # the same virtualenv, completed
    assert "pip install --quiet -e '.[dev]'" in plan


def test_with_a_development_install_make_demo_installs_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "bin" / ".installed").touch()  # newer than pyproject.toml
    assert planned("demo", venv).strip() == f"{venv}/bin/polygate-celery demo"
