"""A governed task whose worker loaded no configuration says so, and where it looked,
instead of naming the scope alone (`no scope named 'summarise'`). Each case runs a real
Celery app's task (eagerly: the body and its governed call run as in a worker)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from polygate_celery import parse_config
from polygate_celery.celery import GovernedCalls, governed
from polygate_celery.celery.runtime import forget_config, register_config, reset_runtime
from polygate_celery.errors import ConfigError

_made = itertools.count()
SCOPES = '[sources.hosted]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n\n'
SCOPES += '[scopes.embed]\nkind = "embedding"\nsources = ["hosted"]\n'


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """An app with one governed task in scope 'summarise', its worker started in an empty
    directory with no POLYGATE_* variable set."""
    monkeypatch.chdir(tmp_path)
    for name in os.environ:
        if name.startswith("POLYGATE_"):
            monkeypatch.delenv(name)
    n = next(_made)
    made = Celery(f"forgotten-{n}", set_as_current=False)

    @made.task(name=f"summarise_{n}", shared=False)
    @governed("summarise")
    def summarise(calls: GovernedCalls, text: str) -> str:
        return str(calls.chat([{"role": "user", "content": text}]).value.text)

    yield made
    reset_runtime(made)
    forget_config(made)


def failure(app: Celery) -> str:
    (task,) = [t for name, t in app.tasks.items() if name.startswith("summarise_")]
    with pytest.raises(ConfigError) as raised:
        task.apply(args=("a document",), throw=True)
    assert raised.value.field == "scopes.summarise"
    return raised.value.message


def test_no_configuration_loaded_is_said_with_where_the_worker_looked(app: Celery) -> None:
    assert failure(app) == (
        "no configuration was loaded, so there is no scope 'summarise': "
        f"configure_worker(app, config) was not called for app {app.main!r}, "
        "$POLYGATE_CONFIG is unset in this worker, and no POLYGATE_* variable sets a scope "
        "or a source"
    )


def test_a_polygate_toml_beside_the_worker_is_named_with_how_to_read_it(
    app: Celery, tmp_path: Path
) -> None:
    (tmp_path / "polygate.toml").write_text(SCOPES.replace("embed", "summarise"))
    found = tmp_path / "polygate.toml"
    assert failure(app).endswith(
        f"sets a scope or a source; {found} exists, but workers read no file by default: "
        f"set POLYGATE_CONFIG={found}"
    )


def test_a_file_without_the_scope_is_named(
    app: Celery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "conf" / "polygate.toml"
    path.parent.mkdir()
    path.write_text(SCOPES)
    monkeypatch.setenv("POLYGATE_CONFIG", str(path))
    assert failure(app) == (
        f"no scope named 'summarise' in {path} ($POLYGATE_CONFIG) (configured: embed)"
    )


def test_a_registered_configuration_without_the_scope_is_named(app: Celery) -> None:
    source = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    embed = {"kind": "embedding", "sources": ["a"]}
    register_config(app, parse_config({"sources": {"a": source}, "scopes": {"embed": embed}}))
    assert failure(app) == (
        "no scope named 'summarise' in the configuration configure_worker registered "
        "(configured: embed)"
    )
