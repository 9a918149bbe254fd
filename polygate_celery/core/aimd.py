"""Decision core: the per-source adaptive concurrency limit (AIMD), as pure transitions.

Additive increase on success, multiplicative decrease on congestion (a 429 or a
timeout), between 1 and the source's cap. Attempts admitted before the latest
decrease belong to the congestion episode already reacted to, so a burst of
429s from requests that were in flight together halves the limit once, not
once per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polygate_celery.core.terms import AimdTerms


@dataclass(frozen=True, slots=True)
class AimdState:
    limit: float
    last_decrease_at: float = -math.inf


def aimd_initial(terms: AimdTerms, cap: int) -> AimdState:
    start = cap if terms.initial_limit is None else terms.initial_limit
    return AimdState(limit=float(max(1, min(cap, start))))


def aimd_permits(state: AimdState, cap: int) -> int:
    """How many permits may be in flight now."""
    return max(1, min(cap, math.floor(state.limit)))


def aimd_on_success(state: AimdState, terms: AimdTerms, cap: int) -> AimdState:
    return AimdState(min(float(cap), state.limit + terms.increase), state.last_decrease_at)


def aimd_on_congestion(
    state: AimdState, terms: AimdTerms, admitted_at: float, now: float
) -> AimdState:
    if admitted_at <= state.last_decrease_at:  # admitted before (or with) the last decrease
        return state
    return AimdState(max(1.0, state.limit * terms.decrease_factor), now)
