"""The mistakes a newcomer makes with the Celery edge are caught where they are made, each
in one line that names the call or the field and says what to do."""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

import pytest
from celery import Celery

from polygate_celery import parse_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed, runtime
from polygate_celery.celery.runtime import register_config, reset_runtime, runtime_for
from polygate_celery.celery.task import check_governed_tasks

CONFIG = parse_config(
    {
        "sources": {"hosted": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
        "scopes": {"summarise": {"kind": "chat", "sources": ["hosted"]}},
    }
)


_made = itertools.count()


def app_with(scope: str) -> Celery:
    """A fresh app (its own main name and task name: Celery warns of a reused task name)."""
    n = next(_made)
    app = Celery(f"newcomer-{n}", set_as_current=False)

    @app.task(name=f"summarise_doc_{n}", shared=False)
    @governed(scope)
    def summarise_doc(calls: GovernedCalls, doc_id: str) -> str:  # pragma: no cover
        return doc_id

    return app


def test_governed_above_app_task_is_refused_at_import() -> None:
    app = Celery("newcomer-order", set_as_current=False)
    with pytest.raises(TypeError, match=r"@governed is above @app.task on 'ask': put it below"):

        @governed("summarise")
        @app.task(name="ask", shared=False)
        def ask(calls: GovernedCalls) -> None:  # pragma: no cover
            pass


def test_a_scope_the_configuration_lacks_is_named_at_worker_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = app_with("summarize")
    register_config(app, CONFIG)
    (name,) = [n for n in app.tasks if n.startswith("summarise_doc_")]
    with caplog.at_level(logging.ERROR, "polygate_celery"):
        problems = check_governed_tasks(app)
    expected = (
        f"task {name!r} is @governed('summarize'), a scope the configuration does not "
        "have (configured: summarise): fix the name, or add [scopes.summarize]"
    )
    # (Celery shares tasks made with shared=True, the default, with every app: those of
    # other test modules may be named too.)
    assert expected in problems
    assert expected in caplog.messages


def test_a_governed_app_without_configure_worker_is_named_at_worker_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POLYGATE_CONFIG", raising=False)
    app = app_with("summarise")
    (problem,) = check_governed_tasks(app)
    assert problem.startswith(f"app {app.main!r} has governed tasks (")
    assert "summarise_doc_" in problem  # among any shared ones of other test modules
    assert (
        "but configure_worker(app, load_config()) was never called for it: call it where the "
        "app is made"
    ) in problem


def test_the_check_runs_when_a_worker_starts(caplog: pytest.LogCaptureFixture) -> None:
    """Connected to Celery's ``worker_init`` (after the task modules are imported)."""
    from celery import signals  # noqa: PLC0415

    app = app_with("summarize")
    register_config(app, CONFIG)

    class Worker:
        def __init__(self, app: Celery) -> None:
            self.app = app

    with caplog.at_level(logging.ERROR, "polygate_celery"):
        signals.worker_init.send(sender=Worker(app))
    assert any("@governed('summarize')" in m for m in caplog.messages)


def test_a_store_that_cannot_be_built_leaves_no_thread_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def cannot(*_: Any, **__: Any) -> Any:
        raise ValueError("cannot build the store")

    monkeypatch.setattr(runtime, "store_from_config", cannot)
    app = app_with("summarise")
    register_config(app, CONFIG)
    before = threading.active_count()
    for _ in range(5):
        with pytest.raises(ValueError, match="cannot build the store"):
            runtime_for(app)
    assert threading.active_count() == before
    reset_runtime(app)


def test_configure_worker_names_each_setting_of_the_users_it_replaces(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("newcomer-settings", set_as_current=False)
    app.conf.task_serializer = "pickle"
    app.conf.worker_prefetch_multiplier = 8
    app.conf.task_ignore_result = True  # not one configure_worker sets
    with caplog.at_level(logging.WARNING, "polygate_celery"):
        configure_worker(app, CONFIG)
    assert sorted(caplog.messages) == [
        "configure_worker replaces task_serializer = 'pickle', set on app "
        "'newcomer-settings', by 'json' for every task: Celery messages are JSON only",
        "configure_worker replaces worker_prefetch_multiplier = 8, set on app "
        "'newcomer-settings', by 1 for every task: one reserved task per process: none "
        "waits behind a stall",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "polygate_celery"):
        configure_worker(app, CONFIG)  # again: its own settings are not the user's
    assert caplog.messages == []
