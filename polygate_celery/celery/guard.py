"""Celery edge: one run per released message, and a cap on messages that kill workers.

Only messages that may be copies or repeats are checked (a deferred task's
later runs, and anything the broker redelivered), so a first, plain run costs
no round trip. A copy of a run that finished or is still running is dropped;
a message redelivered more than `redelivery_cap` times (each time its worker
was lost) fails instead of killing workers forever.
"""

from __future__ import annotations

from typing import Any, Literal

from celery import Task

from polygate_celery.celery.runtime import WorkerRuntime
from polygate_celery.store.redis import LuaScript, lua_text, run_script

Verdict = Literal["go", "done", "running", "poison"]
_SCRIPT = LuaScript(lua_text("polygate_celery.celery", "execution"))


class ExecutionGuard:
    def __init__(self, runtime: WorkerRuntime, task: Task[Any, Any], deferrals: int) -> None:
        self.runtime = runtime
        request = task.request
        self.redelivered = bool((request.delivery_info or {}).get("redelivered"))
        self.deferrals = deferrals
        self.active = runtime.redis is not None and (deferrals > 0 or self.redelivered)
        base = runtime.keys.base if runtime.keys is not None else ""
        run_id = f"{request.id}:{deferrals}"
        self._keys = [
            f"{base}:run:{run_id}",
            f"{base}:done:{run_id}",
            f"{base}:redeliveries:{run_id}",
        ]
        limit = request.timelimit[0] if request.timelimit and request.timelimit[0] else None
        self._run_ttl = float(limit or task.app.conf.task_time_limit or 3600)
        self._done_ttl = runtime.config.deferral.max_defer_age_s
        self._cap = runtime.config.deferral.redelivery_cap

    def begin(self) -> Verdict:
        if not self.active:
            return "go"
        verdict: Verdict = self.runtime.run(self._call("begin"))
        return verdict

    def finish(self) -> None:
        """This message's run is over (success, failure, or deferred): copies are dropped."""
        if self.active:
            self.runtime.run(self._call("finish"))

    def release(self) -> None:
        """This run ended but its message goes on (a Celery retry): the next copy runs."""
        if self.active:
            self.runtime.run(self._call("release"))

    async def _call(self, mode: str) -> Any:
        assert self.runtime.redis is not None
        args = [
            mode,
            repr(self._run_ttl),
            repr(self._done_ttl),
            1 if self.redelivered else 0,
            self._cap,
        ]
        return await run_script(_SCRIPT, self.runtime.redis, self._keys, args)
