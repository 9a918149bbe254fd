"""Celery edge: the signal a deferral sends, for users' own monitoring.

    from polygate_celery.celery.signals import task_deferred

    @task_deferred.connect
    def on_deferred(sender, task_id, reason, due_at, deferrals, **kwargs):
        ...

``sender`` is the task; ``due_at`` is when it runs again (Unix time);
``reason`` is the verdict's (``stalled``, ``fail_fast``, ``deadline`` or
``backend_error``); ``scope``, ``retry_after_s`` and ``strategy`` come too. It
is sent in the worker that deferred the task, after the task was parked (or
sent with a countdown). Beside it a Celery event ``task-deferred`` with the
same fields reaches event receivers (Flower shows the task as ``DEFERRED``).
A receiver that raises is logged, never the deferral's failure.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

task_deferred = Signal(name="task_deferred")
