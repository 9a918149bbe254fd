"""The README's code blocks are accounted for: each runs in a test, or says why not; and
the testing how-to's tests are the example project's, which the packaging tests run."""

from __future__ import annotations

import re
from pathlib import Path

from tests.examples.test_readme_quickstart import README, quickstart_blocks

ROOT = Path(__file__).resolve().parents[2]
TESTING = ROOT / "docs" / "how-to" / "testing.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
RUNNABLE = {"python", "toml", "sh", "bash", "console"}


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """A page's fenced blocks: (language, body, the line before the fence)."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").splitlines()
        found.append((match.group(1), match.group(2), before[-1] if before else ""))
    return found


def test_every_python_block_of_the_readme_is_run_by_a_test() -> None:
    covered = quickstart_blocks().values()
    python = [body for lang, body, _ in blocks(README) if lang == "python"]
    assert python, "the README lost its quick start"
    assert [body for body in python if body not in covered] == []


def test_every_block_of_the_readme_runs_or_says_why_not() -> None:
    """Named files are written, not run; any other block either runs as written or
    carries `<!-- not run: reason -->` on the line before its fence."""
    quiet = []
    for lang, body, before in blocks(README):
        named = re.match(r"#\s*\S+\.\w+\s*$", body.splitlines()[0])
        if lang in RUNNABLE and not named and not before.startswith("<!-- not run"):
            quiet.append(body)
    assert quiet == []


def test_the_testing_pages_tests_are_the_example_projects() -> None:
    """Each test function the page shows is, word for word, one of
    `examples/testing/test_tasks.py`'s (run in a fresh virtualenv by `tests/packaging/`)."""
    example = (ROOT / "examples" / "testing" / "test_tasks.py").read_text()
    shown = [
        "def " + chunk.strip()
        for lang, body, _ in blocks(TESTING)
        if lang == "python"
        for chunk in re.split(r"^def ", body, flags=re.M)[1:]
        if chunk.startswith("test_")
    ]
    assert len(shown) == 3
    for function in shown:
        assert function.rstrip() in example or _without_docstring(example, function), function


def test_the_testing_pages_project_is_the_example_project() -> None:
    files = {
        body.split("\n", 1)[0].lstrip("# ").strip(): body.split("\n", 1)[1]
        for lang, body, _ in blocks(TESTING)
        if lang in {"python", "toml"} and re.match(r"#\s*\S+\.\w+\s*$", body.splitlines()[0])
    }
    assert {"polygate.toml", "tasks.py", "conftest.py", "test_tasks.py"} <= files.keys()
    for name in ("polygate.toml", "tasks.py", "conftest.py"):
        assert files[name] == (ROOT / "examples" / "testing" / name).read_text(), name


def _without_docstring(example: str, function: str) -> bool:
    """The example's function with its docstring left out, as the page shows it."""
    plain = re.sub(r'\n    """[^"]*"""', "", example)
    return function.rstrip() in plain
