"""Celery edge: a chord member whose outcome is stored is counted toward its chord.

A chord's body runs when every member has been counted: on Redis, the member's own
worker process counts it (``on_chord_part_return``) right after storing its outcome.
A worker lost between the two leaves the outcome stored and the part uncounted, and
neither path Celery takes afterwards counts it:

- a pool child lost after storing SUCCESS: Celery's main process finds the success
  stored and acknowledges the message (``Request._success_was_stored``);
- a stored FAILURE, or a whole worker lost: the message comes back, and the execution
  guard drops the copy because an outcome is stored (running it again would store a
  second one).

The body would then never run. Both places count the stored outcome instead
(`ChordCountingRequest`, `count_stored_part`). That is safe only on a backend that
counts each part once: Celery 5.7's Redis backend remembers every ``task id:group
index`` it counted and ignores a finished chord. A backend that polls stored results
(``chord_unlock``) needs no count. On any other, counting again could run the body
early, so a warning names the chord instead.

A worker lost after the last count, while it sends the body, leaves the chord
complete and its dispatch claimed by a process that is gone: a count then finds the
claim held and sends nothing. So when a count leaves a claim held, the chord is
counted once more after the claim's time runs out (Celery's claim is its own crash
recovery: a count after it expired claims the dispatch again and sends the body).
That later count runs on a timer in the process that counted: a process stopped
before it fires leaves the body unsent. It cannot tell a body never sent from one
sent by a process lost before it marked the chord done: it skips the count where
the body has a state stored (a worker has it), and otherwise sends the body again,
at least once as Celery's own redeliveries are (a governed body's execution guard
drops the copy of a run it has seen).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Task, states
from celery.backends.base import BaseBackend
from celery.worker.request import Request

logger = logging.getLogger("polygate_celery")

REQUEST = "polygate_celery.celery.chords:ChordCountingRequest"
CELERY_REQUEST = "celery.worker.request:Request"
# A chord whose dispatch claim is still held after this many later counts is left to
# the claim's holder (each later count waits out the claim it found).
RECOUNTS = 5
RECOUNT_SLACK_S = 1.0


def counts_each_part_once(backend: Any) -> bool:
    """Whether counting a part again is harmless on `backend` (it remembers each part)."""
    try:
        from celery.backends import redis as redis_backend  # noqa: PLC0415
    except ImportError:  # (redis-py is a dependency of the package)
        return False
    script = getattr(redis_backend, "CHORD_PART_RETURN_LUA", "")
    return isinstance(backend, redis_backend.RedisBackend) and "SISMEMBER" in script


def polls_stored_results(backend: Any) -> bool:
    """Whether `backend` joins a chord by polling its members' stored results
    (``chord_unlock``): a stored outcome is all it needs."""
    return type(backend).on_chord_part_return is BaseBackend.on_chord_part_return


def count_stored_part(task: Task[Any, Any], request: Any, meta: dict[str, Any]) -> None:
    """Count the outcome `meta` stored for `request` toward its chord, if it is a
    chord's member. Never raises: a count that fails is logged with the chord's id."""
    chord = getattr(request, "chord", None)
    group = getattr(request, "group", None)
    status = meta.get("status")
    if not chord or not group or status not in states.READY_STATES:
        return
    backend = task.backend
    if polls_stored_results(backend):
        return
    if not counts_each_part_once(backend):
        logger.warning(
            "task %s of chord %s: its outcome is stored but may not have been counted toward "
            "the chord (its worker was lost), and this result backend may count a part "
            "twice; the chord's body may not run",
            request.id,
            group,
        )
        return
    _count(backend, request, status, meta.get("result"), RECOUNTS)


def _count(backend: Any, request: Any, status: str, result: Any, recounts: int) -> None:
    """Count the part; while a dispatch claim is left held, count again once it ran
    out, `recounts` times at most. Never raises."""
    group = request.group
    try:
        if recounts < RECOUNTS and body_has_state(backend, request.chord):
            return  # (the claim's holder sent the body and was lost before marking it)
        backend.on_chord_part_return(request, status, result)
    except Exception:
        logger.warning(
            "task %s of chord %s: counting its stored outcome toward the chord failed; the "
            "chord's body may not run",
            request.id,
            group,
            exc_info=True,
        )
        return
    try:
        held_s = claim_held_s(backend, group)
    except Exception:
        logger.warning(
            "task %s of chord %s: counted, but the chord's dispatch claim could not be read; "
            "if the process that claimed it was lost, the chord's body may not run",
            request.id,
            group,
            exc_info=True,
        )
        return
    if held_s is None:
        return
    if recounts <= 0:
        logger.warning(
            "task %s of chord %s: the chord's dispatch is still claimed after %d later "
            "counts; its body runs only if the claim's holder sends it",
            request.id,
            group,
            RECOUNTS,
        )
        return
    timer = threading.Timer(
        held_s + RECOUNT_SLACK_S, _count, args=(backend, request, status, result, recounts - 1)
    )
    timer.daemon = True
    timer.start()


def body_has_state(backend: Any, chord: Any) -> bool:
    """Whether the body of `chord` (the member's ``request.chord``, a signature) has a
    state stored: it was sent and a worker has it, so the chord was dispatched."""
    options = chord.get("options") if isinstance(chord, dict) else None
    body_id = (options or {}).get("task_id")
    if not body_id:
        return False
    return bool(backend.get_task_meta(body_id).get("status") != states.PENDING)


def claim_held_s(backend: Any, group: str) -> float | None:
    """Seconds left on the dispatch claim of chord `group` (Celery's Redis backend
    claims a complete chord's dispatch for a bounded time, then marks it done), or
    None: no claim is held (the chord is not complete yet, or its body was sent)."""
    key = backend.get_key_for_group(group, ".c")
    with backend.client.pipeline(transaction=False) as pipe:
        value, ttl_ms = pipe.get(key).pttl(key).execute()
    if value is None or value in (b"done", "done"):
        return None
    return max(int(ttl_ms), 0) / 1000.0


class ChordCountingRequest(Request):
    """Celery's request, counting a chord member whose worker was lost after it
    stored SUCCESS (Celery acknowledges such a message without counting it).

    Celery asks whether SUCCESS was stored only for a lost worker, with a bounded
    lookup (a few attempts, so a result backend that is down cannot hold the worker's
    main process); the count reuses what that lookup read."""

    def _success_was_stored(self) -> Any:
        meta = super()._success_was_stored()  # type: ignore[misc]
        if meta:  # (count_stored_part counts chord members alone)
            count_stored_part(self.task, getattr(self, "_context", None), meta)
        return meta


def install_counting_request(tasks: Any) -> list[str]:
    """Give every task in `tasks` the counting request where it uses Celery's own (a
    task with a request class of its own keeps it): plain chord members, beside
    governed ones, are lost in the same window. Returns the names changed."""
    changed = []
    for name, task in list(tasks.items()):
        if task.Request == CELERY_REQUEST:
            task.Request = REQUEST
            changed.append(name)
    return changed
