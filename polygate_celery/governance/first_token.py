"""Governance layer: whether an attempt's slow first token may be cut (SPEC §3 rule 17).

A first-token limit (`ttft_timeout_s`) is a failover trigger, not a verdict on
the source: cutting a slow first token is worth it only when another source of
the scope could serve the call instead. On the last source left, the attempt
waits for its first token up to its `timeout_s`, so a slow but healthy source
stays reachable.

"Could serve" is judged once, when the attempt starts, from what the call and
the fleet know then: another source of the scope that this call has not
excluded (a rejection), whose breaker is not open and that no Retry-After
pauses. Capacity and quotas are left out on purpose: they free up within the
wait for a first token, where an open breaker or a pause announces a longer
absence. The store is asked only for an attempt whose source would cut a first
token at all (a streamed chat request with a limit), so other attempts cost no
round trip more.
"""

from __future__ import annotations

from collections.abc import Collection

from polygate_celery.governance.plan import ScopePlan
from polygate_celery.store.base import SourceSnapshot, Store


async def another_could_serve(
    store: Store, plan: ScopePlan, source: str, excluded: Collection[str]
) -> bool:
    """Whether a source of `plan` other than `source`, not in `excluded`, could serve now."""
    for other in plan.sources:
        if other == source or other in excluded:
            continue
        if could_serve(await store.snapshot(plan.terms[other])):
            return True
    return False


def could_serve(snapshot: SourceSnapshot) -> bool:
    """A source that takes calls now, or within a wait for a permit."""
    return snapshot.breaker != "open" and snapshot.paused_for_s <= 0
