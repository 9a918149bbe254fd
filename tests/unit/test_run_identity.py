"""A run's identity survives every republish: a message from a producer that never
imported the package keeps its (empty) submission through deferrals and held-back copies,
so the parked entry's name and the run that begins from it agree."""

from __future__ import annotations

from typing import Any

from celery import Celery

from polygate_celery.celery.identity import COPY, DEFERRALS, SUBMISSION, RunIdentity
from polygate_celery.celery.parking import capture_message

app = Celery("identity-tests", broker="memory://", set_as_current=False)


@app.task(shared=False)
def noop() -> None:
    """A task to build messages of."""


def published_headers(headers: dict[str, Any]) -> dict[str, Any]:
    message = capture_message(noop.signature((), {}, headers=headers))
    published: dict[str, Any] = message["headers"]
    return published


def test_a_new_submission_gets_its_own_id() -> None:
    first, second = published_headers({})[SUBMISSION], published_headers({})[SUBMISSION]
    assert first
    assert second != first


def test_a_foreign_runs_republish_keeps_its_empty_submission() -> None:
    run = RunIdentity("task-1", "", 0, 0)
    headers = published_headers(run.pinned({DEFERRALS: 1}))
    assert headers[SUBMISSION] == ""
    assert headers[DEFERRALS] == 1
    assert run.deferred().key == "task-1::1:0"  # the entry's name = the released run's key


def test_a_republish_keeps_the_runs_submission() -> None:
    run = RunIdentity("task-1", "abc", 2, 1)
    headers = published_headers(run.pinned({SUBMISSION: "other", COPY: 1}))
    assert (headers[SUBMISSION], headers[COPY]) == ("abc", 1)
