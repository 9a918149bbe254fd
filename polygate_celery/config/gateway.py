"""Configuration: the gateway model, defaults merging and the cross-field rules."""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from polygate_celery.config import models
from polygate_celery.config.fields import Name, _Strict, deep_merge
from polygate_celery.config.priority import (
    PriorityConfig,
    Tenant,
    TenantConfig,
    priority_problems,
    standing_of,
)
from polygate_celery.config.store import StoreConfig
from polygate_celery.core.standing import Standing
from polygate_celery.errors import ConfigError

# A governed task's stall window when the configuration leaves it unset (SPEC §3 rule 16):
# a task that meets an outage parks after about a minute instead of holding its worker
# slot for a direct caller's 300 s, and waits in the parking lot instead.
GOVERNED_STALL_WINDOW_S = 60.0


class GatewayConfig(_Strict):
    """Sources, shared quotas and scopes, priority classes and tenants. `*_defaults` apply
    under every entry."""

    store: StoreConfig = StoreConfig()
    deferral: models.DeferralConfig = models.DeferralConfig()
    include_bodies: bool = Field(
        False,
        strict=True,  # also where the environment's loader is lax (it types text itself)
        description="add truncated provider error bodies to attempt reasons (marked as such); "
        "they may hold prompt text",
    )
    source_defaults: models.SourceSettings = models.SourceSettings()
    scope_defaults: models.ScopeSettings = models.ScopeSettings()
    sources: dict[Name, models.SourceConfig] = Field(default_factory=dict)
    quotas: dict[Name, models.QuotaConfig] = Field(default_factory=dict)
    scopes: dict[Name, models.ScopeConfig] = Field(default_factory=dict)
    priorities: dict[Name, PriorityConfig] = Field(default_factory=dict)
    tenant_defaults: TenantConfig = TenantConfig()
    tenants: dict[Tenant, TenantConfig] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _apply_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for table, defaults_key in (
            ("sources", "source_defaults"),
            ("scopes", "scope_defaults"),
            ("tenants", "tenant_defaults"),
        ):
            defaults = data.get(defaults_key)
            entries = data.get(table)
            if isinstance(defaults, dict) and isinstance(entries, dict):
                data[table] = {
                    name: deep_merge(defaults, entry) if isinstance(entry, dict) else entry
                    for name, entry in entries.items()
                }
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        problems: list[tuple[str, str]] = []
        for name, source in self.sources.items():
            if source.quota is not None and source.quota not in self.quotas:
                problems.append((f"sources.{name}.quota", f"no quota named {source.quota!r}"))
        for name, scope in self.scopes.items():
            path = f"scopes.{name}"
            for i, source_name in enumerate(scope.sources):
                if source_name not in self.sources:
                    problems.append((f"{path}.sources.{i}", f"no source named {source_name!r}"))
            if scope.backoff_max_s < scope.backoff_base_s:
                problems.append((f"{path}.backoff_max_s", "must be at least backoff_base_s"))
            if scope.retry_after_cap_s < scope.poll_interval_s:
                problems.append((f"{path}.retry_after_cap_s", "must be at least poll_interval_s"))
            # Conservative and, under the two-budget model, redundant: time to the
            # first token is productive attempt time and never burns the stall
            # budget. Kept as a cheap guard against a clearly inconsistent setup.
            ttfts = [
                self.sources[s].ttft_timeout_s
                for s in scope.sources
                if s in self.sources and self.sources[s].ttft_timeout_s is not None
            ]
            worst = max((t for t in ttfts if t is not None), default=None)
            if worst is not None and scope.stall_window_s < worst:
                problems.append(
                    (
                        f"{path}.stall_window_s",
                        f"must be at least the largest ttft_timeout_s of its sources ({worst:g})",
                    )
                )
        if self.deferral.max_delay_s < self.deferral.min_delay_s:
            problems.append(("deferral.max_delay_s", "must be at least min_delay_s"))
        problems += priority_problems(self.priorities)
        if problems:
            raise ConfigError(problems[0][0], problems[0][1], problems)
        return self

    def for_governed_tasks(self) -> GatewayConfig:
        """This configuration as governed tasks run it: each scope whose `stall_window_s`
        was not set (neither in the scope nor in `scope_defaults`) gets
        `GOVERNED_STALL_WINDOW_S` (never less than its sources' largest `ttft_timeout_s`);
        a window set explicitly is kept."""
        changed = {}
        for name, scope in self.scopes.items():
            if "stall_window_s" in scope.model_fields_set:
                continue
            ttfts = [self.sources[s].ttft_timeout_s for s in scope.sources if s in self.sources]
            window = max([GOVERNED_STALL_WINDOW_S, *(t for t in ttfts if t is not None)])
            if window < scope.stall_window_s:
                changed[name] = scope.model_copy(update={"stall_window_s": window})
        if not changed:
            return self
        return self.model_copy(update={"scopes": {**self.scopes, **changed}})

    def standing(self, priority: str | None = None, tenant: str | None = None) -> Standing:
        """Where a call of class `priority` for `tenant` stands among the waiters of a
        source: its class's rank (`priority` None: the class marked `default`, else the
        last declared), the tenant's weight (declared in ``[tenants]``, else
        ``tenant_defaults``; `tenant` None: no tenant, weighed as an undeclared one) and
        every class's floor. With no class declared, no tenant and the default weight (1):
        the shared `PLAIN`.

        Raises:
            ConfigError: `priority` names no class (``priority``), or `tenant` is not 1
                to 64 letters, digits or ``_ . : @ -`` (``tenant``).
        """
        return standing_of(self.priorities, self.tenant_defaults, self.tenants, priority, tenant)

    def max_call_s(self, scope: str) -> float:
        """The scope's hard call deadline, derived when not set."""
        config = self.scopes[scope]
        if config.max_call_s is not None:
            return config.max_call_s
        worst_timeout = max(self.sources[s].timeout_s for s in config.sources)
        return config.max_attempts * worst_timeout + 2 * config.stall_window_s
