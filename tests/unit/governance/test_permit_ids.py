"""Permit ids never repeat across processes, forked ones included (Celery's prefork pool)."""

from __future__ import annotations

import multiprocessing

from polygate_celery.governance import loop


def _next_id(queue: multiprocessing.Queue[str]) -> None:
    queue.put(next(loop._permit_ids))


def test_a_forked_worker_draws_permit_ids_of_its_own() -> None:
    parent = next(loop._permit_ids)
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = context.Queue()
    child = context.Process(target=_next_id, args=(queue,))
    child.start()
    child.join(30)
    child_id = queue.get(timeout=5)
    assert child_id.split("-")[0] != parent.split("-")[0]
