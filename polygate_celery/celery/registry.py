"""Celery edge: which of an app's tasks are governed, and the scope each was given."""

from __future__ import annotations

from celery import Celery

GOVERNED = "__polygate_governed__"  # set on the body `@governed` wraps
SCOPE = "__polygate_scope__"  # the scope given to `@governed` (None: none)


def governed_tasks(app: Celery) -> dict[str, str | None]:
    """`app`'s governed tasks: name -> the scope given to `@governed` (None: none given)."""
    found: dict[str, str | None] = {}
    for name, task in app.tasks.items():
        run = getattr(type(task), "run", None)
        if getattr(run, GOVERNED, False):
            found[name] = getattr(run, SCOPE, None)
    return found
