"""The package's structure rules: module sizes, imports pointing inward only, and no
module-level registry in the Celery edge. Each allow-list names today's exceptions and
must only shrink: an entry that no longer applies fails until it is removed."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "polygate_celery"
MAX_LINES = 400

# Over MAX_LINES today, each waiting for its split. This list must only shrink: never add
# a module to it, split the module instead.
STILL_OVER_400: set[str] = set()

# The layer of each top-level module or package of polygate_celery; an import may point
# to the same layer or a lower one, never a higher one. `clock`, `errors`, `telemetry`
# and `blocks` sit beside `core`; the edges (and the package's face, its __init__) are
# not ordered among themselves. `testing` is public and may import anything; what it is
# to the others is an edge.
LAYERS = {
    "core": 0,
    "clock": 0,
    "errors": 0,
    "telemetry": 0,
    "blocks": 0,
    "config": 1,
    "store": 2,
    "sources": 2,
    "governance": 3,
    "celery": 4,
    "cli": 4,
    "demo": 4,
    "otel": 4,
    "metrics": 4,
    "embedded": 4,
    "__main__": 4,
    "__init__": 4,
    "testing": 4,
}
IMPORTS_ANYTHING = {"testing"}
# Upward arrows of today (importer, imported). This list must only shrink.
STILL_UPWARD: set[tuple[str, str]] = set()

# Module-level registries allowed in the Celery edge (module, name): none, and it stays so.
# State belongs on the object Celery hands over (the app, the task), not in a module's
# dictionary.
STILL_REGISTRIES: set[tuple[str, str]] = set()
MUTABLE_MAKERS = {
    "dict",
    "list",
    "set",
    "defaultdict",
    "OrderedDict",
    "Counter",
    "deque",
    "WeakKeyDictionary",
    "WeakValueDictionary",
    "WeakSet",
    "local",  # threading.local(): a registry per thread
}


def modules() -> Iterator[tuple[str, Path]]:
    """(path relative to the package, file) of every module."""
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), path


def module_name(relative: str) -> str:
    parts = ["polygate_celery", *relative.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(name: str) -> tuple[str, int]:
    """The top-level part of `name` (a dotted module name) and its layer."""
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    assert top in LAYERS, f"{name}: put polygate_celery.{top} in a layer (LAYERS)"
    return top, LAYERS[top]


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported(relative: str, tree: ast.Module) -> Iterator[str]:
    """Every polygate_celery module `tree` imports, anywhere in it: at the top, in a
    function (a lazy import is still a dependency) and under `if TYPE_CHECKING:` (a
    type the module names is one it depends on to be read)."""
    package = module_name(relative)
    if not relative.endswith("__init__.py"):
        package = package.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:  # `from polygate_celery import config` is config's
                submodule = f"{source}.{alias.name}"
                yield submodule if is_module(submodule) else source


def upward_arrows() -> set[tuple[str, str]]:
    arrows = set()
    for relative, path in modules():
        importer = module_name(relative)
        top, level = layer_of(importer)
        if top in IMPORTS_ANYTHING:
            continue
        for name in imported(relative, ast.parse(path.read_text(encoding="utf-8"))):
            if name.split(".")[0] == "polygate_celery" and layer_of(name)[1] > level:
                arrows.add((importer, name))
    return arrows


def registries() -> set[tuple[str, str]]:
    """Module-level names in celery/ bound to a mutable container (a literal, a
    comprehension or a call making one), but for ALL_CAPS constants and dunders."""
    found = set()
    for relative, path in modules():
        if not relative.startswith("celery/"):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if isinstance(value, ast.Call):
                func = value.func
                maker = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                mutable = maker in MUTABLE_MAKERS
            else:
                containers = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
                mutable = isinstance(value, containers)
            for target in targets:
                if not (mutable and isinstance(target, ast.Name)):
                    continue
                name = target.id
                if name.startswith("__") or name.lstrip("_").isupper():
                    continue
                found.add((relative, name))
    return found


def test_no_module_is_over_400_lines() -> None:
    sizes = {
        relative: len(path.read_text(encoding="utf-8").splitlines()) for relative, path in modules()
    }
    over = {relative for relative, lines in sizes.items() if lines > MAX_LINES}
    assert over <= STILL_OVER_400, f"split these modules (at most {MAX_LINES} lines): " + (
        ", ".join(f"{r} ({sizes[r]})" for r in sorted(over - STILL_OVER_400))
    )
    split = STILL_OVER_400 - over
    assert not split, f"no longer over {MAX_LINES} lines: remove from STILL_OVER_400: {split}"


def test_imports_point_inward_only() -> None:
    arrows = upward_arrows()
    new = arrows - STILL_UPWARD
    assert not new, "imports from a higher layer: " + ", ".join(
        f"{a} -> {b}" for a, b in sorted(new)
    )
    gone = STILL_UPWARD - arrows
    assert not gone, f"no longer there: remove from STILL_UPWARD: {gone}"


def test_no_module_level_registry_in_the_celery_edge() -> None:
    found = registries()
    new = found - STILL_REGISTRIES
    assert not new, "module-level mutable state in celery/ (keep it on the app or the task): " + (
        ", ".join(f"{module}:{name}" for module, name in sorted(new))
    )
    gone = STILL_REGISTRIES - found
    assert not gone, f"no longer there: remove from STILL_REGISTRIES: {gone}"


@pytest.mark.parametrize(
    ("source", "arrow"),
    [
        ("from polygate_celery.governance.loop import GovernedCall\n", True),
        ("def f():\n    from polygate_celery.celery import governed\n", True),
        ("if TYPE_CHECKING:\n    from polygate_celery.store.base import Store\n", True),
        ("from polygate_celery import governance\n", True),
        ("from polygate_celery.core.outcome import Outcome\n", False),
        ("from polygate_celery import errors\n", False),
    ],
)
def test_the_import_check_sees_every_kind_of_import(source: str, arrow: bool) -> None:
    """From a config module, each of these points up (or not)."""
    names = imported("config/example.py", ast.parse(source))
    assert any(layer_of(name)[1] > LAYERS["config"] for name in names) is arrow
