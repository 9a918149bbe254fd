"""Governance layer: `Gateway`, the async entry point that runs governed calls.

Usable without Celery. One gateway per process (per worker process under
Celery): it holds the store, the clock, the random source and the adapters
every call shares, while each call gets its own `StallClock`.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from polygate_celery.clock import Clock, SystemClock
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.errors import ConfigError
from polygate_celery.governance.lease import LeaseRenewer
from polygate_celery.governance.loop import CallResult, GovernedCall, Runtime
from polygate_celery.governance.places import PlaceKeeper
from polygate_celery.governance.plan import CallerKind, ScopePlan
from polygate_celery.sources.base import Source
from polygate_celery.sources.exchange import OpenAIStyleSource
from polygate_celery.sources.factory import sources_from_config
from polygate_celery.sources.payloads import (
    ChatRequest,
    EmbeddingRequest,
    OcrRequest,
    estimate_tokens,
)
from polygate_celery.store.base import SourceSnapshot, Store
from polygate_celery.store.factory import store_from_config
from polygate_celery.telemetry import Telemetry, TelemetryHook


class Gateway:
    """Runs calls to the scopes of `config` through the governance loop.

    Make one per process and share it: it holds the store, the clock and the
    sources' clients every call uses. Pass a `VirtualClock` and
    ``random=lambda: 0.0`` to run deterministically in virtual time.

    Args:
        config: The scopes, sources, quotas and store (`load_config`, `parse_config`).
        sources: Each source name's adapter. Default: the HTTP adapters the
            configuration describes, closed by `aclose`.
        store: Where governance state lives. Default: the one the configuration
            names (a `RedisStore` when ``[store]`` names a Redis, else an in-memory
            store on `clock`), closed by `aclose`.
        clock: Default: the system clock.
        random: Uniform draws in [0, 1) for jitter. Default: `random.random`.
        hooks: Telemetry hooks; each receives every event of every call.
        scope_gate: A stalled verdict closes the scope for its `retry_after_s`:
            other calls then end `stalled` at once, bar one probe at a time,
            until a success or the time passes (what a Celery worker wants:
            tasks defer at once instead of each waiting out a stall window).
        caller: Who makes the calls. ``"direct"``: code that awaits them and
            cannot park, whose transient failures on a scope that shows no
            progress burn the retry budget unless their source's breaker is
            open. ``"task"``: governed Celery tasks, which park, so those
            failures are charged to waiting. Default: ``"task"`` with
            `scope_gate` (only a caller that parks closes a gate), else
            ``"direct"``. A scope's `outage_is_waiting`, when set, holds for both.

    Raises:
        ConfigError: A scope uses a source that `sources` has no adapter for.
    """

    def __init__(
        self,
        config: GatewayConfig,
        sources: Mapping[str, Source] | None = None,
        *,
        store: Store | None = None,
        clock: Clock | None = None,
        random: Callable[[], float] | None = None,
        hooks: Sequence[TelemetryHook] = (),
        scope_gate: bool = False,
        caller: CallerKind | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        # No store given: the one the configuration names (Redis when `store.redis_url`
        # is set), owned and closed by this gateway.
        self._owns_store = store is None
        self.store = (
            store if store is not None else store_from_config(config.store, clock, groups_of=config)
        )
        # No sources given: the configuration's adapters, owned and closed by this gateway.
        self._own_sources: dict[str, OpenAIStyleSource] = {}
        if sources is None:
            sources = self._own_sources = sources_from_config(config)
        used = {name for scope in config.scopes.values() for name in scope.sources}
        missing = sorted(used - set(sources))
        if missing:
            raise ConfigError(f"sources.{missing[0]}", "no adapter was given for this source")
        kind: CallerKind = caller or ("task" if scope_gate else "direct")
        # Where a call that names no class and no tenant stands: the same for every call.
        self._unnamed = config.standing()
        self._classes = tuple(config.priorities)  # a rank's class name, for telemetry
        self._plans = {name: ScopePlan.build(config, name, kind) for name in config.scopes}
        self._runtime = Runtime(
            store=self.store,
            clock=self.clock,
            random=random or _random.random,
            telemetry=Telemetry(hooks),
            sources=dict(sources),
            leases=LeaseRenewer(self.store, self.clock),
            places=PlaceKeeper(self.store, self.clock),
            scope_gate=scope_gate,
            classes=bool(config.priorities),
        )

    def plan(self, scope: str) -> ScopePlan:
        """The resolved settings of `scope` (its sources' terms, budgets and backoff).

        Raises:
            ConfigError: The configuration has no scope of that name.
        """
        try:
            return self._plans[scope]
        except KeyError:
            raise ConfigError(f"scopes.{scope}", f"no scope named {scope!r}") from None

    async def call(
        self,
        scope: str,
        payload: Any,
        *,
        est_tokens: int | None = None,
        fail_fast: bool = False,
        priority: str | None = None,
        tenant: str | None = None,
    ) -> CallResult:
        """Run one governed call of `payload` in `scope`.

        Args:
            scope: The scope's name in the configuration.
            payload: What the sources' adapters send (`chat`, `embed` and `ocr`
                build it for the HTTP adapters).
            est_tokens: Tokens reserved against TPM quotas until the answer
                reports what it used (and, while the call waits, its cost to its
                tenant in fair queuing). Default: estimated from a `ChatRequest`,
                `EmbeddingRequest` or `OcrRequest` (`estimate_tokens`), else 0.
            fail_fast: Raise at once when nothing is runnable, instead of waiting.
            priority: The call's class in ``[priorities]``. Default: the class
                marked ``default``, else the last declared.
            tenant: Whom the call is for: any 1 to 64 letters, digits or
                ``_ . : @ -``; its weight is its ``[tenants]`` entry's, else
                ``tenant_defaults``'. Default: none.

        Returns:
            The first success, with the source that served it and the attempt trail.

        Raises:
            AllSourcesExhausted: The loop gave up, with a verdict (`reason`).
            SourceFatalError: A request no source can serve (never retried).
            GovernanceBackendError: The store could not answer; nothing was sent.
            ConfigError: The configuration has no scope of that name, or no class
                `priority`, or `tenant` is not a tenant.
        """
        plan = self.plan(scope)
        if est_tokens is None:
            est_tokens = estimate_tokens(payload)
        if priority is None and tenant is None:
            standing = self._unnamed
        else:
            standing = self.config.standing(priority, tenant)
        named = self._classes[standing.rank] if self._classes else None
        call = GovernedCall(
            self._runtime, plan, payload, est_tokens, fail_fast, standing, priority=named
        )
        return await call.run()

    async def chat(
        self,
        scope: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: bool | None = None,
        fail_fast: bool = False,
        priority: str | None = None,
        tenant: str | None = None,
        **params: Any,
    ) -> CallResult:
        """A chat completion, governed as `call` is (raising what it raises).

        Args:
            scope: A scope of kind ``chat``.
            messages: OpenAI-style messages (``{"role": ..., "content": ...}``).
            stream: Stream the answer. Default: the source's `stream` setting
                (unset: streamed when the source has a `ttft_timeout_s`).
            fail_fast: As in `call`.
            priority: As in `call`.
            tenant: As in `call`.
            **params: Sent to the provider as they are (temperature, max_tokens, ...).

        Returns:
            A `CallResult` whose `value` is a `ChatResult` (`text`, `finish_reason`).
        """
        request = ChatRequest(list(messages), params, stream)
        return await self.call(
            scope, request, fail_fast=fail_fast, priority=priority, tenant=tenant
        )

    async def embed(
        self,
        scope: str,
        inputs: Sequence[str],
        *,
        fail_fast: bool = False,
        priority: str | None = None,
        tenant: str | None = None,
    ) -> CallResult:
        """Embeddings of `inputs`, in one batched request, governed as `call` is (raising
        what it raises).

        Args:
            scope: A scope of kind ``embedding``.
            inputs: The texts (a single string is one input).
            fail_fast: As in `call`.
            priority: As in `call`.
            tenant: As in `call`.

        Returns:
            A `CallResult` whose `value` is an `EmbeddingResult` (`vectors`, in order).
        """
        request = EmbeddingRequest.of(inputs)
        return await self.call(
            scope, request, fail_fast=fail_fast, priority=priority, tenant=tenant
        )

    async def ocr(
        self,
        scope: str,
        image: bytes,
        *,
        mime: str = "image/png",
        prompt: str | None = None,
        fail_fast: bool = False,
        priority: str | None = None,
        tenant: str | None = None,
    ) -> CallResult:
        """The text in `image`, governed as `call` is (raising what it raises).

        Args:
            scope: A scope of kind ``ocr``.
            image: The image's bytes.
            mime: Its media type.
            prompt: The instruction sent with it. Default: none to an OCR endpoint;
                the source's `ocr_prompt` where the image goes through a chat.
            fail_fast: As in `call`.
            priority: As in `call`.
            tenant: As in `call`.

        Returns:
            A `CallResult` whose `value` is an `OcrResult` (`text`).
        """
        request = OcrRequest(image, mime, prompt)
        return await self.call(
            scope, request, fail_fast=fail_fast, priority=priority, tenant=tenant
        )

    async def aclose(self) -> None:
        """Stop renewing leases and keeping places; close the clients of the sources built
        from the configuration on this event loop, and the store it built (call after the
        last call has ended)."""
        await self._runtime.leases.aclose()
        await self._runtime.places.aclose()
        if self._owns_store:
            await self.store.aclose()
        for source in self._own_sources.values():
            await source.aclose()

    async def snapshot(self, scope: str) -> list[SourceSnapshot]:
        """The governance state of each source of `scope`, read from the store.

        Returns:
            One snapshot per source, in the scope's order: permits in use, the
            adaptive limit, the breaker, a pause.
        """
        plan = self.plan(scope)
        return [await self.store.snapshot(plan.terms[name]) for name in plan.sources]
