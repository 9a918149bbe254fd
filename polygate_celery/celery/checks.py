"""Celery edge: what a worker checks of an app's governed tasks as it starts.

Each mistake that would fail every run of a task (a scope or a priority class the
configuration does not have, `configure_worker` never called) is logged as one
error line at ``worker_init``, for every app, configured or not.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals

from polygate_celery.celery.priority import unknown_classes
from polygate_celery.celery.registry import governed_priorities, governed_tasks
from polygate_celery.celery.runtime import registered_config
from polygate_celery.config.loading import load_config
from polygate_celery.errors import ConfigError

logger = logging.getLogger("polygate_celery")


def check_governed_tasks(app: Celery) -> list[str]:
    """At worker start: each problem with `app`'s governed tasks, logged as an error, one
    line each. A governed app that never called `configure_worker`; a task whose
    `@governed` scope or priority class the configuration does not have (its every run
    would fail)."""
    tasks = governed_tasks(app)
    if not tasks:
        return []
    problems = []
    config = registered_config(app)
    if config is None:
        problems.append(
            f"app {app.main!r} has governed tasks ({', '.join(sorted(tasks))}) but "
            "configure_worker(app, load_config()) was never called for it: call it where the "
            "app is made (without it: no late acknowledgement, no time limits, no parking lot, "
            "and the configuration is read from $POLYGATE_CONFIG at the first task)"
        )
        try:
            config = load_config()
        except ConfigError:
            config = None
    if config is not None and config.scopes:  # none at all: the problem above says why
        scopes = sorted(config.scopes)
        for name, scope in sorted(tasks.items()):
            if scope is not None and scope not in config.scopes:
                problems.append(
                    f"task {name!r} is @governed({scope!r}), a scope the configuration does "
                    f"not have (configured: {', '.join(scopes) or 'none'}): fix the name, or "
                    f"add [scopes.{scope}]"
                )
    if config is not None:
        problems += unknown_classes(governed_priorities(app), config)
    for problem in problems:
        logger.error("%s", problem)
    return problems


def _check_at_worker_start(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if isinstance(app, Celery):
        check_governed_tasks(app)


signals.worker_init.connect(_check_at_worker_start, weak=False)
