"""Decision core: the per-call stall clock that splits a call's time between its two budgets."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Attempt:
    """Handle of one attempt inside `StallClock.attempting()`.

    `refund()` moves the attempt's time back to the stall budget: the loop calls
    it for a 429 that does not burn the retry budget, so that time burns one
    budget or the other, never neither.
    """

    __slots__ = ("refunded",)

    def __init__(self) -> None:
        self.refunded = False

    def refund(self) -> None:
        self.refunded = True


class StallClock:
    """Stall time of one call: everything except attempts that burn the retry budget.

    ``stalled_s = (now - entered_at) - productive_s``. The split is "which budget
    does this time burn", never "was a request sent": a timed-out attempt burns
    the retry budget and no stall time, a 429 exempt from the retry budget is
    refunded to the stall budget. Taking the complement (rather than marking each
    wait) means any wait added to the loop later is stall time by default.

    One instance per call, never shared: a concurrent call must not see another
    call's clock. `now` is the local monotonic clock (or an injected one), never
    the store's clock.
    """

    __slots__ = ("_now", "entered_at", "productive_s")

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.entered_at = now()
        self.productive_s = 0.0

    def elapsed_s(self) -> float:
        return self._now() - self.entered_at

    def stalled_s(self) -> float:
        return self.elapsed_s() - self.productive_s

    @contextmanager
    def attempting(self) -> Iterator[Attempt]:
        """Count the enclosed time as productive unless the handle is refunded.

        The bookkeeping is plain arithmetic in ``finally``: it swallows nothing,
        so cancellation passes straight through.
        """
        attempt = Attempt()
        started = self._now()
        try:
            yield attempt
        finally:
            if not attempt.refunded:
                self.productive_s += self._now() - started


def is_stalled(stalled_s: float, progress_age_s: float, stall_window_s: float) -> bool:
    """The stall verdict (SPEC §3 rule 2): both this call and the whole scope are stuck.

    `progress_age_s` is ``inf`` when the scope never succeeded (or its progress
    expired); ``inf`` counts as exceeded.
    """
    return stalled_s > stall_window_s and (
        math.isinf(progress_age_s) or progress_age_s > stall_window_s
    )
