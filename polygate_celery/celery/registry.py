"""Celery edge: which of an app's tasks are governed, and the scope and class each was given."""

from __future__ import annotations

from celery import Celery

GOVERNED = "__polygate_governed__"  # set on the body `@governed` wraps
SCOPE = "__polygate_scope__"  # the scope given to `@governed` (None: none)
PRIORITY = "__polygate_priority__"  # the priority class given to `@governed` (None: none)


def governed_tasks(app: Celery) -> dict[str, str | None]:
    """`app`'s governed tasks: name -> the scope given to `@governed` (None: none given)."""
    return {name: getattr(run, SCOPE, None) for name, run in _governed_bodies(app).items()}


def governed_priorities(app: Celery) -> dict[str, str]:
    """`app`'s governed tasks that name a priority class: name -> the class."""
    found = {name: getattr(run, PRIORITY, None) for name, run in _governed_bodies(app).items()}
    return {name: priority for name, priority in found.items() if priority is not None}


def _governed_bodies(app: Celery) -> dict[str, object]:
    found: dict[str, object] = {}
    for name, task in app.tasks.items():
        run = getattr(type(task), "run", None)
        if getattr(run, GOVERNED, False):
            found[name] = run
    return found
