"""Decision core: the order in which a call asks the store for its scope's sources."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal

# Why the store passed a source over when it admitted no call there ("tenant_cap": the
# call's tenant is at one of its own caps there, SPEC §8).
BlockReason = Literal[
    "paused", "breaker_open", "probe_in_flight", "at_capacity", "quota", "tenant_cap"
]


def preference_order(
    sources: Sequence[str],
    excluded: Collection[str],
    last_failure: Mapping[str, int],
    stay: str | None = None,
) -> list[str]:
    """Sources to try, best first.

    Configuration order is priority. A source that failed during this call goes
    behind every source that has not, the most recent failure last, so after a
    failure the next attempt prefers a different runnable source, and a failing
    route is not retried while an alternative is open. Sources in `excluded`
    (they rejected this request) are left out entirely. `last_failure` maps a
    source to the attempt number of its latest failure in this call. `stay` (a
    source the call retries once after a 5xx or a connection error, SPEC §5
    "Failover discipline") goes first, if it is still a candidate.
    """
    candidates = [s for s in sources if s not in excluded]
    rank = {s: i for i, s in enumerate(sources)}
    order = sorted(candidates, key=lambda s: (last_failure.get(s, -1), rank[s]))
    if stay in order:
        order.remove(stay)
        order.insert(0, stay)
    return order
