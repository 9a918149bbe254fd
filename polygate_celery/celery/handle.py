"""Celery edge: the handle a governed task body makes its model calls through.

Calls run on the worker's event loop and block the task's thread (`GovernedCalls`),
or are awaited in an async task body (`AsyncGovernedCalls`). With `reuse_results`,
each successful call's result is kept in Redis under the task id and the call's
position in the body, so a task that is deferred and runs again gets the answers
it already paid for without asking the provider a second time. Kept results
belong to the submission (task id and ``polygate_submission``): another
submission with the same task id never gets them. A call's success also makes
the tasks an outage of its scope parked due at once (`Lot.wake`): the
scope answers again. Every call is in the run's priority class and for its tenant
(`polygate_celery.celery.priority`), unless it names its own ``priority=`` or
``tenant=``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from polygate_celery.celery.parking import lot_name, starved_index
from polygate_celery.celery.runtime import WorkerRuntime
from polygate_celery.errors import GovernanceBackendError
from polygate_celery.governance.loop import CallResult
from polygate_celery.sources import payloads
from polygate_celery.store.redis import translated

logger = logging.getLogger("polygate_celery")
WAKE_INTERVAL_S = 1.0  # the most often one process wakes one scope's parked tasks
_RESULT_TYPES: dict[str, type[Any]] = {
    "chat": payloads.ChatResult,
    "embedding": payloads.EmbeddingResult,
    "ocr": payloads.OcrResult,
}


def _encode(result: CallResult) -> str:
    value = result.value
    kind = next((k for k, t in _RESULT_TYPES.items() if isinstance(value, t)), "json")
    data = dataclasses.asdict(value) if kind != "json" else value
    return json.dumps(
        {
            "kind": kind,
            "value": data,
            "source": result.source,
            "model": result.model,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
        }
    )


def _decode(text: str) -> CallResult:
    data = json.loads(text)
    kind = data["kind"]
    value = _RESULT_TYPES[kind](**data["value"]) if kind in _RESULT_TYPES else data["value"]
    return CallResult(
        value=value,
        source=data["source"],
        model=data["model"],
        prompt_tokens=data["prompt_tokens"],
        completion_tokens=data["completion_tokens"],
        attempts=(),
        elapsed_s=0.0,
    )


class _Calls:
    def __init__(
        self,
        runtime: WorkerRuntime,
        submission: str,
        scope: str | None,
        *,
        reuse: bool = False,
        rerun: bool = False,
        priority: str | None = None,
        tenant: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.submission = submission
        self.scope = scope
        self.priority = priority  # the run's class and tenant: a call's own win
        self.tenant = tenant
        self._reuse = reuse and runtime.redis is not None
        self._rerun = rerun
        self._positions = itertools.count()
        self.reused = 0

    def _scope(self, scope: str | None) -> str:
        chosen = scope or self.scope
        if chosen is None:
            raise ValueError("no scope: give one to @governed(...) or to the call")
        return self.runtime.check_scope(chosen)

    def _standing(self, priority: str | None, tenant: str | None) -> tuple[str | None, str | None]:
        """A call's class and tenant: its own, else the run's."""
        return (
            self.priority if priority is None else priority,
            self.tenant if tenant is None else tenant,
        )

    async def _governed(
        self, make: Callable[[], Awaitable[CallResult]], scope: str, priority: str | None
    ) -> CallResult:
        position = next(self._positions)
        key = None
        if self._reuse:
            assert self.runtime.keys is not None
            key = f"{self.runtime.keys.base}:paid:{self.submission}:{position}"
            if self._rerun:
                kept = await self._redis("get", key)
                if kept is not None:
                    self.reused += 1
                    return _decode(kept)
        result = await make()
        await self._wake_parked(scope, result, priority)
        if key is not None:
            try:
                ttl = int(self.runtime.config.deferral.reuse_ttl_s)
                await self._redis("set", key, _encode(result), ex=ttl)
            except (GovernanceBackendError, TypeError, ValueError):
                pass  # keeping a paid result is a saving, never a reason to fail
        return result

    async def _wake_parked(self, scope: str, result: CallResult, priority: str | None) -> None:
        """The scope answered: the tasks its outage parked become due now (SPEC §3 rule
        16), instead of when their estimated delays end; the release loop publishes them
        and the scope's permits and quotas pace their runs. So do the tasks of the call's
        class (`priority`, None for the default) that other classes starved: their class
        is served again (SPEC §8). Never fails the call.

        Once per `WAKE_INTERVAL_S` per index and process at most: a success of a scope
        that serves needs no script of its own, and a recovery is seen within it."""
        if self.runtime.state is None:
            return
        indexes = [scope]
        classes = list(self.runtime.config.priorities)
        if classes:
            rank = self.runtime.config.standing(priority, None).rank
            indexes.append(starved_index(scope, classes[rank]))
        now = self.runtime.gateway.clock.now()
        for index in indexes:
            if now - self.runtime.woken_at.get(index, -WAKE_INTERVAL_S) < WAKE_INTERVAL_S:
                continue
            self.runtime.woken_at[index] = now
            try:
                lot = self.runtime.state.lot(lot_name(self.runtime.app))
                woken = await lot.wake(index)
            except Exception:
                logger.warning("%r: waking its parked tasks failed", index, exc_info=True)
                continue
            if woken:
                logger.info(
                    "%r served again (%s): %d parked task(s) due now", index, result.source, woken
                )

    async def _redis(self, command: str, *args: Any, **kwargs: Any) -> Any:
        assert self.runtime.redis is not None
        with translated():
            return await getattr(self.runtime.redis, command)(*args, **kwargs)


class AsyncGovernedCalls(_Calls):
    """For ``async def`` task bodies: the same calls, awaited."""

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        scope: str | None = None,
        stream: bool | None = None,
        fail_fast: bool = False,
        priority: str | None = None,
        tenant: str | None = None,
        **params: Any,
    ) -> CallResult:
        """A chat completion (`Gateway.chat`).

        Args:
            messages: OpenAI-style messages.
            scope: Default: the one given to `@governed`.
            stream: As in `Gateway.chat`.
            fail_fast: As in `Gateway.call`.
            priority: The call's class. Default: the task's (``@governed(priority=)``,
                or the message's ``polygate_priority`` header).
            tenant: Whom the call is for. Default: the task's (its ``tenant_arg``
                argument, or the message's ``polygate_tenant`` header).
            **params: Sent to the provider as they are.

        Returns:
            The call's result; ``value`` is a `ChatResult`.

        Raises:
            ValueError: No scope was given here or to `@governed`.
            ConfigError: As in `Gateway.call`: an undeclared class, a malformed tenant.
        """
        request = payloads.ChatRequest(list(messages), params, stream)
        return await self._send(scope, request, None, fail_fast, priority, tenant)

    async def embed(
        self,
        inputs: Sequence[str] | str,
        *,
        scope: str | None = None,
        fail_fast: bool = False,
        priority: str | None = None,
        tenant: str | None = None,
    ) -> CallResult:
        """Embeddings of `inputs` (`Gateway.embed`); `scope`, `priority` and `tenant` as in
        `chat`."""
        request = payloads.EmbeddingRequest.of(inputs)
        return await self._send(scope, request, None, fail_fast, priority, tenant)

    async def ocr(
        self,
        image: bytes,
        *,
        scope: str | None = None,
        mime: str = "image/png",
        prompt: str | None = None,
        fail_fast: bool = False,
        priority: str | None = None,
        tenant: str | None = None,
    ) -> CallResult:
        """The text in `image` (`Gateway.ocr`); `scope`, `priority` and `tenant` as in
        `chat`."""
        request = payloads.OcrRequest(image, mime, prompt)
        return await self._send(scope, request, None, fail_fast, priority, tenant)

    async def call(
        self,
        payload: Any,
        *,
        scope: str | None = None,
        est_tokens: int | None = None,
        priority: str | None = None,
        tenant: str | None = None,
    ) -> CallResult:
        """A call of a custom `payload` (`Gateway.call`, `est_tokens` as there); `scope`,
        `priority` and `tenant` as in `chat`."""
        return await self._send(scope, payload, est_tokens, False, priority, tenant)

    async def _send(
        self,
        scope: str | None,
        payload: Any,
        est_tokens: int | None,
        fail_fast: bool,
        priority: str | None,
        tenant: str | None,
    ) -> CallResult:
        """`Gateway.call` of `payload` in the call's scope, class and tenant (its own, else
        the run's), its result kept for a rerun (`_governed`)."""
        gateway, chosen = self.runtime.gateway, self._scope(scope)
        priority, tenant = self._standing(priority, tenant)
        return await self._governed(
            lambda: gateway.call(
                chosen,
                payload,
                est_tokens=est_tokens,
                fail_fast=fail_fast,
                priority=priority,
                tenant=tenant,
            ),
            chosen,
            priority,
        )


class GovernedCalls:
    """For ordinary task bodies: each call blocks the task until its verdict."""

    def __init__(self, calls: AsyncGovernedCalls) -> None:
        self._calls = calls

    @property
    def reused(self) -> int:
        """Calls answered from results kept before a deferral."""
        return self._calls.reused

    def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> CallResult:
        """A chat completion: as `AsyncGovernedCalls.chat`, blocking."""
        return self._calls.runtime.run(self._calls.chat(messages, **kwargs))

    def embed(self, inputs: Sequence[str] | str, **kwargs: Any) -> CallResult:
        """Embeddings: as `AsyncGovernedCalls.embed`, blocking."""
        return self._calls.runtime.run(self._calls.embed(inputs, **kwargs))

    def ocr(self, image: bytes, **kwargs: Any) -> CallResult:
        """OCR: as `AsyncGovernedCalls.ocr`, blocking."""
        return self._calls.runtime.run(self._calls.ocr(image, **kwargs))

    def call(self, payload: Any, **kwargs: Any) -> CallResult:
        """A call of a custom payload: as `AsyncGovernedCalls.call`, blocking."""
        return self._calls.runtime.run(self._calls.call(payload, **kwargs))
