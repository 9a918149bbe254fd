"""Decision core: the governance terms of a source, as the store needs them on every call.

The terms travel with each store operation rather than living in the store, so
the store holds state only, and a Redis script receives everything it decides
with in its arguments. A configuration change reaches the whole fleet as soon
as each worker runs with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RpmWindow = Literal["sliding", "bucket"]


@dataclass(frozen=True, slots=True)
class BreakerTerms:
    """The breaker's terms; the defaults are the configuration's (`BreakerConfig`)."""

    failure_threshold: int = 5
    cooldown_s: float = 10.0
    auth_cooldown_s: float = 600.0


@dataclass(frozen=True, slots=True)
class AimdTerms:
    increase: float = 1.0
    decrease_factor: float = 0.5
    initial_limit: int | None = None


@dataclass(frozen=True, slots=True)
class QuotaTerms:
    """A requests-per-minute and/or tokens-per-minute quota, possibly shared.

    `name` is the quota group: sources that share a provider key share one.
    `rpm_window` says how requests are counted (see `core.quota`); tokens always
    use the bucket. None (not declared): as a bucket, unless the provider's answers
    show that it counts in windows, which requests then follow.
    """

    name: str
    rpm: int | None = None
    tpm: int | None = None
    rpm_window: RpmWindow | None = None


@dataclass(frozen=True, slots=True)
class SourceTerms:
    name: str
    max_concurrency: int
    breaker: BreakerTerms = BreakerTerms()
    aimd: AimdTerms = AimdTerms()
    quota: QuotaTerms | None = None


def follows_provider_windows(quota: QuotaTerms | None) -> bool:
    """Whether requests follow the provider's windows when its answers show them: unless
    the user declared how rpm is counted (`rpm_window`)."""
    return quota is None or quota.rpm_window is None
