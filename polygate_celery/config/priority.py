"""Configuration: priority classes and tenants (SPEC §8), and where a call stands among them.

``[priorities.<name>]`` tables name the classes, highest first: the order they
are declared in is their rank. ``[tenants.<name>]`` give tenants their weights,
and ``[tenant_defaults]`` the weight and caps of every other tenant (and the settings a
declared one leaves unset, as ``source_defaults`` does for sources): tenants are
often customer ids, too many to declare, so a call may name any tenant.
`standing_of` turns a call's class and tenant into the `Standing` it carries to the
store; the stores order their waiters by it, and hold its tenant to its caps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, StringConstraints

from polygate_celery.config.fields import MAX_CONCURRENCY, MAX_RPM, MAX_TPM, _Strict
from polygate_celery.core.standing import MAX_CLASSES, PLAIN, Standing, TenantCaps
from polygate_celery.errors import ConfigError

TENANT_PATTERN = r"^[A-Za-z0-9_.:@-]{1,64}$"
_TENANT = re.compile(TENANT_PATTERN)

Tenant = Annotated[str, StringConstraints(pattern=TENANT_PATTERN)]
"""A tenant: 1 to 64 letters, digits or ``_ . : @ -`` (it becomes part of Redis members)."""

# Weights within a million of each other: a waiting call's tag grows by its tokens over its
# weight, and stays far below `core.standing.RANK_SPAN`.
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1000.0


class PriorityConfig(_Strict):
    """A priority class. Of the calls waiting for the same source, those of a class declared
    earlier are served first, but for the floors: a class with waiters that has had less
    than its `min_share` of the recent grants is served before the classes above it."""

    min_share: float = Field(
        0.0,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="share of the grants the class keeps while it has waiters, ahead of the "
        "classes above it (the classes' shares add up to less than 1)",
    )
    default: bool = Field(
        False,
        description="calls that name no class are in this one (at most one class; "
        "none marked: the last declared, the lowest)",
    )


class TenantConfig(_Strict):
    """A tenant's share, and its caps. Within a class, calls waiting for a source's permits
    or a quota's slots are served by weighted fair queuing on their estimated tokens:
    tenants that keep calls waiting get tokens in the ratio of their weights, and an idle
    tenant's share goes to the others. The caps hold at each source the tenant's calls go
    to, fleet-wide, as the source's own do: a call over one waits (within its stall
    window) and is not sent."""

    weight: float = Field(
        1.0,
        ge=MIN_WEIGHT,
        le=MAX_WEIGHT,
        allow_inf_nan=False,
        description="the tenant's weight against the others waiting in its class",
    )
    max_concurrency: int | None = Field(
        None,
        ge=1,
        le=MAX_CONCURRENCY,
        description="the tenant's calls in flight at each source, fleet-wide (unset: no cap)",
    )
    rpm: int | None = Field(
        None, ge=1, le=MAX_RPM, description="the tenant's requests per minute at each source"
    )
    tpm: int | None = Field(
        None, ge=1, le=MAX_TPM, description="the tenant's tokens per minute at each source"
    )

    @property
    def caps(self) -> TenantCaps | None:
        """The tenant's caps, None if it has none."""
        caps = TenantCaps(self.max_concurrency, self.rpm, self.tpm)
        return caps if caps else None


def priority_problems(priorities: Mapping[str, PriorityConfig]) -> list[tuple[str, str]]:
    """(path, why) of each rule the classes break together: one default at most, and
    floors that add up to less than 1 (else a floor could never be kept)."""
    problems: list[tuple[str, str]] = []
    if len(priorities) > MAX_CLASSES:
        name = list(priorities)[MAX_CLASSES]
        problems.append((f"priorities.{name}", f"at most {MAX_CLASSES} classes may be declared"))
    defaults = [name for name, entry in priorities.items() if entry.default]
    for name in defaults[1:]:
        problems.append(
            (f"priorities.{name}.default", f"only one class may be the default ({defaults[0]} is)")
        )
    shares: list[float] = []
    for name, entry in priorities.items():
        shares.append(entry.min_share)
        total = math.fsum(shares)
        if entry.min_share > 0 and total >= 1:
            problems.append(
                (
                    f"priorities.{name}.min_share",
                    f"the classes' min_share add up to {total:g} with this one: they must "
                    "add up to less than 1",
                )
            )
            break
    return problems


def standing_of(
    priorities: Mapping[str, PriorityConfig],
    tenant_defaults: TenantConfig,
    tenants: Mapping[str, TenantConfig],
    priority: str | None,
    tenant: str | None,
) -> Standing:
    """Where a call of class `priority` (None: the default class) for `tenant` (None: no
    tenant) stands: see `GatewayConfig.standing`."""
    caps = None
    if tenant is None:
        name, weight = "", tenant_defaults.weight
    elif isinstance(tenant, str) and _TENANT.fullmatch(tenant):
        entry = tenants.get(tenant) or tenant_defaults
        name, weight, caps = tenant, entry.weight, entry.caps
    else:
        raise ConfigError("tenant", "a tenant is 1 to 64 letters, digits or _ . : @ -")
    if not priorities:
        if priority is not None:
            raise ConfigError(
                "priority", f"no priority class named {priority!r}: [priorities] declares none"
            )
        rank, floors = 0, tuple[float, ...]()
    else:
        names = list(priorities)
        if priority is None:
            rank = next(
                (i for i, entry in enumerate(priorities.values()) if entry.default), len(names) - 1
            )
        elif priority in priorities:
            rank = names.index(priority)
        else:
            raise ConfigError(
                "priority",
                f"no priority class named {priority!r}; the classes are {', '.join(names)}",
            )
        shares = tuple(entry.min_share for entry in priorities.values())
        floors = shares if any(shares) else ()
    # One class at most, no tenant, the default weight: the shared PLAIN (a call of the
    # top class of two or more is not plain: it may take a lower class's booked slot).
    if len(priorities) <= 1 and not name and not floors and weight == PLAIN.weight:
        return PLAIN
    return Standing(rank=rank, tenant=name, weight=weight, floors=floors, caps=caps)
