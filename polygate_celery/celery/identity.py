"""Celery edge: which submission and which run a governed task's message belongs to.

A task id alone does not say which work a message carries: a user may send two
submissions with one explicit ``task_id``, a Celery retry and a deferral keep
the id, and ``Task.replace`` hands it to another task. So every publish of a
task that does not already carry one gets a ``polygate_submission`` header (a
fresh uuid) from a ``before_task_publish`` handler; deferrals and Celery
retries republish the request's headers and keep it, while a new
``apply_async`` (or a replacement) gets its own. A *run* is one message of a
submission: (task id, submission, deferral number, ``request.retries``).
Markers, kept results and parking-lot entries are keyed by these, never by
the task id alone.

A message published by a process that never imported this package (``send_task``
from a web app, another team's service) has no submission header: its
submission is the empty one. Every republish of it by this package (a
deferral, a held-back copy) names that submission explicitly, so the stamp
below leaves it as it is: the run a parked entry starts, and the run that
begins from it, carry one key whoever published the first message.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from celery import Task, signals

SUBMISSION = "polygate_submission"
DEFERRALS = "polygate_deferrals"
COPY = "polygate_copy"  # a copy of a live run, parked until that run is over


def _stamp_submission(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """``before_task_publish``: give a new submission its id (Celery lets receivers edit
    the message headers here). A header that is present, even empty (a republished
    message from a producer without this package), is the message's own: kept."""
    if headers is not None and SUBMISSION not in headers:
        headers[SUBMISSION] = uuid.uuid4().hex


signals.before_task_publish.connect(_stamp_submission, weak=False)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """One run of one submission of a task."""

    task_id: str
    submission: str
    deferrals: int
    retries: int

    @classmethod
    def of(cls, task: Task[Any, Any]) -> RunIdentity:
        request = task.request
        headers = request.headers or {}
        submission = headers.get(SUBMISSION)
        return cls(
            task_id=str(request.id),
            submission=submission if isinstance(submission, str) else "",
            deferrals=_count(headers.get(DEFERRALS)),
            retries=_count(request.retries),
        )

    @property
    def key(self) -> str:
        """``<task id>:<submission>:<deferral>:<retries>``, the run's part of its keys."""
        return f"{self.submission_key}:{self.deferrals}:{self.retries}"

    @property
    def submission_key(self) -> str:
        return f"{self.task_id}:{self.submission}"

    def pinned(self, headers: dict[str, Any]) -> dict[str, Any]:
        """`headers` for a republish of this run's message: its submission named, so the
        publish does not stamp a new one (the run's key would then change in flight)."""
        return {**headers, SUBMISSION: self.submission}

    def deferred(self) -> RunIdentity:
        """The run that a deferral of this one releases later."""
        return RunIdentity(self.task_id, self.submission, self.deferrals + 1, self.retries)
