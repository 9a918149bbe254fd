"""Governance layer: a scope's configuration resolved into what one call needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.models import SourceConfig
from polygate_celery.config.urls import origin_of
from polygate_celery.core.engine import CallRules, OutageCharge, replace
from polygate_celery.core.policy import KindPolicy, policy_for
from polygate_celery.core.terms import AimdTerms, BreakerTerms, QuotaTerms, SourceTerms


def source_terms(config: GatewayConfig, name: str) -> SourceTerms:
    """The governance terms of source `name`, with its private or shared quota."""
    source: SourceConfig = config.sources[name]
    quota: QuotaTerms | None = None
    if source.quota is not None:
        shared = config.quotas[source.quota]
        quota = QuotaTerms(
            f"shared:{source.quota}", shared.rpm, shared.tpm, rpm_window=shared.rpm_window
        )
    elif source.rpm is not None or source.tpm is not None:
        quota = QuotaTerms(f"source:{name}", source.rpm, source.tpm, rpm_window=source.rpm_window)
    return SourceTerms(
        name=name,
        max_concurrency=source.max_concurrency,
        breaker=BreakerTerms(
            failure_threshold=source.breaker.failure_threshold,
            cooldown_s=source.breaker.cooldown_s,
            auth_cooldown_s=source.breaker.auth_cooldown_s,
        ),
        aimd=AimdTerms(
            increase=source.aimd.increase,
            decrease_factor=source.aimd.decrease_factor,
            initial_limit=source.aimd.initial_limit,
        ),
        quota=quota,
    )


_KEPT_RULES = 256  # a plan's rules kept per distinct call options

# Who makes a gateway's calls: a "direct" caller awaits `Gateway.call` and cannot park;
# a governed Celery "task" defers (parks) when its call ends `stalled`, so waiting is cheap.
CallerKind = Literal["direct", "task"]


def outage_charge(outage_is_waiting: bool | None, caller: CallerKind) -> OutageCharge:
    """The scope's `outage_is_waiting` as set, else by caller (rule 15 as amended):
    waiting is the default only where it is cheap, in a task that parks. A direct call
    would otherwise hang a whole stall window on a scope that never answered, so its
    ambiguous failures burn the retry budget unless the breaker shows the outage."""
    if outage_is_waiting is None:
        return "waiting" if caller == "task" else "waiting_if_breaker_open"
    return "waiting" if outage_is_waiting else "retry_budget"


def claim_for(poll_interval_s: float) -> float:
    """How long a permit handed to a waiting call is held for it: past the call's next
    poll (at most `poll_interval_s` away) with a second to spare, so a waiter that
    missed the wake-up message still finds it; a dead waiter's lapses as soon."""
    return 2 * poll_interval_s + 1.0


@dataclass(frozen=True, kw_only=True)
class ScopePlan(CallRules):
    """Everything the loop reads about a scope, resolved once per gateway: the engine's
    `CallRules` for its calls (their own options, `est_tokens` to `scope_gate`, left at
    their defaults until a call sets them), and what the driver needs besides."""

    name: str
    policy: KindPolicy
    terms: Mapping[str, SourceTerms]
    models: Mapping[str, str | None]
    # each source's origin, for telemetry: scheme, host and port of its base URL, no more
    servers: Mapping[str, str | None] = field(default_factory=dict)
    # the terms of `sources`, in their order: the candidates of a call's first ask
    candidates: tuple[SourceTerms, ...] = field(init=False, repr=False, compare=False)

    # the rules of calls by their options, made once each (`for_call`)
    _for_calls: dict[tuple[int, bool, bool], CallRules] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", tuple(self.terms[s] for s in self.sources))

    def for_call(self, est_tokens: int, fail_fast: bool, scope_gate: bool) -> CallRules:
        """The engine's rules for a call with these options: this plan with them set.
        Kept per distinct options (at most `_KEPT_RULES`, then made afresh): copying a
        plan this wide costs more than a look-up, and calls that share their options
        (custom payloads, a task's repeated prompts) find theirs."""
        key = (est_tokens, fail_fast, scope_gate)
        rules = self._for_calls.get(key)
        if rules is None:
            if len(self._for_calls) >= _KEPT_RULES:
                self._for_calls.clear()
            rules = replace(self, est_tokens=est_tokens, fail_fast=fail_fast, scope_gate=scope_gate)
            self._for_calls[key] = rules
        return rules

    @classmethod
    def build(cls, config: GatewayConfig, name: str, caller: CallerKind = "direct") -> ScopePlan:
        scope = config.scopes[name]
        policy = policy_for(scope.kind, scope.rate_limit_exempt)
        return cls(
            name=name,
            policy=policy,
            rate_limit_exempt=policy.rate_limit_exempt,
            sources=tuple(scope.sources),
            terms={s: source_terms(config, s) for s in scope.sources},
            timeouts={s: config.sources[s].timeout_s for s in scope.sources},
            models={s: config.sources[s].model for s in scope.sources},
            max_attempts=scope.max_attempts,
            stall_window_s=scope.stall_window_s,
            max_call_s=config.max_call_s(name),
            backoff_base_s=scope.backoff_base_s,
            backoff_max_s=scope.backoff_max_s,
            poll_interval_s=scope.poll_interval_s,
            retry_after_cap_s=scope.retry_after_cap_s,
            claim_s=claim_for(scope.poll_interval_s),
            outage_charge=outage_charge(scope.outage_is_waiting, caller),
            same_source_retries=scope.same_source_retries,
            wait_out_retry_after_s=scope.wait_out_retry_after_s,
            servers={s: origin_of(config.sources[s].base_url) for s in scope.sources},
        )
