"""The manual's reference pages say what the code does: generated ones are current, and the
hand-written ones list every event field, metric and Redis key the code has."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from polygate_celery import parse_config, telemetry
from polygate_celery.celery.deferral import _deferral_fields
from polygate_celery.core.outcome import AttemptRecord
from polygate_celery.metrics import GovernanceCollector, PrometheusHook
from polygate_celery.store.redis.keys import KeySpace
from tests.docs import reference_pages
from tests.docs.reference_pages import PAGES, ROOT

PACKAGE = ROOT / "polygate_celery"
EVENTS = ROOT / "docs" / "reference" / "events.md"
REDIS_KEYS = ROOT / "docs" / "reference" / "redis-keys.md"


@pytest.mark.parametrize("path", sorted(PAGES), ids=str)
def test_each_generated_page_is_current(path: Path) -> None:
    assert (ROOT / path).read_text(encoding="utf-8") == PAGES[path](), (
        f"{path} is out of date: run `python -m tests.docs.reference_pages --write`"
    )


def test_the_cli_page_has_every_command_and_option() -> None:
    text = reference_pages.cli_page()
    for command in ("demo", "status", "check-config", "source pause", "example"):
        assert f"`polygate-celery {command}`" in text
    assert "| `--watch [SECONDS]` |" in text
    assert "| `NAME` | the source's name in the configuration |" in text


def test_the_writer_reports_a_stale_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.md"
    page.write_text("old\n", encoding="utf-8")
    monkeypatch.setattr(reference_pages, "ROOT", tmp_path)
    monkeypatch.setattr(reference_pages, "PAGES", {Path("page.md"): lambda: "new\n"})
    assert reference_pages.main([]) == 1
    assert "page.md is out of date" in capsys.readouterr().out
    assert reference_pages.main(["--write"]) == 0
    assert page.read_text(encoding="utf-8") == "new\n"
    assert reference_pages.main([]) == 0


# -- event fields ------------------------------------------------------------------------------


def _tables(path: Path) -> dict[str, list[str]]:
    """Each heading's table: heading text -> the first cells of its rows (without backticks)."""
    tables: dict[str, list[str]] = {}
    heading = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            tables[heading] = []
        elif line.startswith("| ") and not line.startswith("|---"):
            cell = line.split("|")[1].strip()
            tables[heading].append(cell.strip("`"))
    return {heading: rows[1:] for heading, rows in tables.items() if rows}  # no header row


def test_every_event_class_and_field_is_on_the_events_page() -> None:
    tables = _tables(EVENTS)
    classes = [*typing.get_args(telemetry.Event), AttemptRecord]
    for cls in classes:
        fields = [field.name for field in dataclasses.fields(cls)]
        assert tables.get(f"`{cls.__name__}`") == fields, f"{cls.__name__}'s fields"


def test_every_deferral_field_is_on_the_events_page() -> None:
    fields = list(_deferral_fields("stalled", "s", 1.0, 1, 2.0, "park"))
    assert _tables(EVENTS)["The deferral signal and Celery event"] == fields


def _rows(path: Path, heading: str) -> dict[str, set[str]]:
    """metric -> labels, from the page's table under `heading`."""
    rows, inside = {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            inside = line.lstrip("#").strip() == heading
        elif inside and line.startswith("| `"):
            cells = [cell.strip() for cell in line.split("|")[1:-1]]
            labels = {label.strip("` ") for label in cells[1].split(",") if label.strip()}
            rows[cells[0].strip("`")] = labels
    return rows


def test_every_metric_and_its_labels_are_on_the_events_page() -> None:
    registry = CollectorRegistry()
    hook = PrometheusHook(registry)
    counters = {
        f"{counter._name}_total": set(counter._labelnames)
        for counter in vars(hook).values()
        if hasattr(counter, "_labelnames")
    }
    assert _rows(EVENTS, "Counters (`PrometheusHook`)") == counters
    config = parse_config(
        {"sources": {"a": {}}, "scopes": {"s": {"kind": "chat", "sources": ["a"]}}}
    )
    gauges = {
        family.name: set(getattr(family, "_labelnames", ()))
        for family in GovernanceCollector(config).describe()
    }
    assert _rows(EVENTS, "Gauges (`GovernanceCollector`)") == gauges


# -- the Redis key layout ----------------------------------------------------------------------

# The start of a key as the Celery edge's code holds it (a variable or an expression),
# as the page writes it. An f-string that begins with another expression, then ":word",
# fails the test until its root is named here (or in NOT_KEYS).
ROOTS = {
    "base": "{p}:v1",
    "self.runtime.keys.base": "{p}:v1",
    "lot": "{p}:v1:parked:<lot>",
    "self.keys[0]": "{p}:v1:parked:<lot>",
    "index": "{p}:v1:parked:<lot>:scope:<scope>",
}
NOT_KEYS = {"guard.run.key"}  # a parked entry's id ("<run>:copy"), a member, not a key


def _normal(key: str) -> str:
    """A key pattern with its placeholders and its tag made anonymous."""
    key = re.sub(r"<[^>]*>", "<>", key)
    return re.sub(r"^\{[^}]*\}", "{}", key)


def _listed_keys() -> set[str]:
    text = REDIS_KEYS.read_text(encoding="utf-8")
    return {_normal(key) for key in re.findall(r"`(\{[pt]\}:v1:[^`]*)`", text)}


def _key_space_keys() -> set[str]:
    space = KeySpace()
    keys = {space.wake + "<origin>", space.quota(None, "<source>")}
    for name, member in inspect.getmembers(KeySpace):
        if name.startswith("_") or name in {"base", "pattern", "wake"}:
            continue
        if callable(member):
            method = getattr(space, name)
            required = [
                p for p in inspect.signature(method).parameters.values() if p.default is p.empty
            ]
            keys.add(method(*(f"<{p.name}>" for p in required)))
    return keys


def _lua_keys() -> set[str]:
    keys = set()
    for script in PACKAGE.rglob("*.lua"):
        for line in script.read_text(encoding="utf-8").splitlines():
            if line.startswith("--"):
                keys.update(re.findall(r"\{p\}:v1:[^\s,)]+", line))
    return keys


def _code_keys() -> set[str]:
    """Keys the Python code builds outside the key space, from f-strings ``f"{root}:word..."``."""
    keys = set()
    for module in PACKAGE.rglob("*.py"):
        if module.name == "keys.py":
            continue
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.JoinedStr) or len(node.values) < 2:
                continue
            first, then = node.values[0], node.values[1]
            if not (isinstance(first, ast.FormattedValue) and isinstance(then, ast.Constant)):
                continue
            if not re.match(r":[a-z]", str(then.value)):
                continue
            root = ast.unparse(first.value)
            if root in NOT_KEYS:
                continue
            assert root in ROOTS, f"{module}:{node.lineno}: a key built on {root!r}: name it"
            parts = [ROOTS[root]]
            for value in node.values[1:]:
                if isinstance(value, ast.Constant):
                    parts.append(str(value.value))
                else:
                    parts.append(f"<{ast.unparse(value.value)}>")
            keys.add("".join(parts))
    return keys


@pytest.mark.parametrize(
    "found", [_key_space_keys, _lua_keys, _code_keys], ids=["key space", "lua", "celery edge"]
)
def test_every_key_the_code_builds_is_on_the_redis_keys_page(found: typing.Any) -> None:
    keys = found()
    assert keys
    missing = sorted(key for key in keys if _normal(key) not in _listed_keys())
    assert not missing, f"keys not on {REDIS_KEYS.name}: {missing}"


def test_every_lua_script_is_on_the_redis_keys_page() -> None:
    text = REDIS_KEYS.read_text(encoding="utf-8")
    scripts = sorted(str(s.relative_to(PACKAGE)) for s in PACKAGE.rglob("*.lua"))
    assert scripts
    assert [s for s in scripts if f"`{s}`" not in text] == []


def test_the_scan_finds_the_celery_edges_keys() -> None:
    """The f-string scan is what guards the Celery keys: it must see them."""
    found = {_normal(key) for key in _code_keys()}
    assert {"{}:v1:run:<>", "{}:v1:paid:<>:<>", "{}:v1:parked:<>:dead"} <= found
