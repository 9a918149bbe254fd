"""Store layer (memory): the limits a source's provider announced, as settle.lua keeps them.

The requests and tokens buckets a provider's rate-limit headers teach
(`core.quota.learned_tat`), and its requests window when its answers show it
counts in windows (`core.quota.window_learn`), forgotten `LEARNED_TTL_S` after
the last announcement; an admission is checked and charged against them beside
any declared quota.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.quota import (
    LEARNED_TTL_S,
    WINDOW_KEPT_S,
    counts_in_windows,
    gcra_reserve,
    gcra_settle,
    learned_tat,
    window_charge,
    window_learn,
    window_take,
)


@dataclass
class Bucket:
    limit: int
    tat: float
    since: float  # learned since: a permit admitted before was not charged to it


@dataclass
class Learned:
    """The limits a source's provider announced: "req" (rpm) and "tok" (tpm) buckets,
    and the provider's requests window (its end, what is left of it, and when an answer
    last showed that the provider counts in windows), forgotten `LEARNED_TTL_S` after the
    last announcement."""

    buckets: dict[str, Bucket] = field(default_factory=dict)
    seen: float = -math.inf
    window_end: float = -math.inf
    window_left: float = 0.0
    window_seen: float = -math.inf

    def live(self, now: float) -> dict[str, Bucket]:
        if now - self.seen > LEARNED_TTL_S:
            self.buckets.clear()
            self.window_end, self.window_left, self.window_seen = -math.inf, 0.0, -math.inf
        return self.buckets

    def in_windows(self, now: float, follow: bool) -> bool:
        """Whether requests follow the provider's window now (see `core.quota`)."""
        return follow and "req" in self.live(now) and now - self.window_seen <= WINDOW_KEPT_S

    def check(
        self, now: float, est_tokens: int, windows: bool, declared_rpm: int | None
    ) -> dict[str, float] | float:
        """New TATs (and the window's "end" and "left") if the announced limits admit,
        else seconds until they may. With `windows`, requests follow the provider's
        window, a `declared_rpm` lower than its limit holding back the difference."""
        tats: dict[str, float] = {}
        waits: list[float] = []
        buckets = self.live(now)
        for dimension, cost in (("req", 1), ("tok", est_tokens)):
            if dimension in buckets and cost > 0:
                bucket = buckets[dimension]
                if dimension == "req" and windows:
                    taken = window_take(
                        self.window_end, self.window_left, now, bucket.limit, declared_rpm
                    )
                    if isinstance(taken, float):
                        waits.append(taken)
                    else:
                        tats["end"], tats["left"] = taken
                    continue
                tats[dimension], wait = gcra_reserve(bucket.tat, now, cost, bucket.limit)
                if wait is not None:
                    waits.append(wait)
        if "req" in tats:  # counted as a bucket: the window is kept up to date
            tats["left"] = window_charge(self.window_end, self.window_left, now)
        return max(waits) if waits else tats

    def take(self, tats: dict[str, float]) -> None:
        """Record an admission `check` allowed."""
        for dimension, tat in tats.items():
            if dimension == "end":
                self.window_end = tat
            elif dimension == "left":
                self.window_left = tat
            else:
                self.buckets[dimension].tat = tat

    def settle_tokens(self, now: float, admitted_at: float, est: int, used: int) -> None:
        """Replace the estimate the bucket charged at admission by the use, if it did."""
        bucket = self.live(now).get("tok")
        if bucket is not None and est > 0 and admitted_at > bucket.since:
            bucket.tat = gcra_settle(bucket.tat, est, used, bucket.limit)

    def learn(self, now: float, limits: RateLimits) -> None:
        buckets = self.live(now)
        for dimension, limit, remaining in (
            ("req", limits.requests_limit, limits.requests_remaining),
            ("tok", limits.tokens_limit, limits.tokens_remaining),
        ):
            if limit is not None and limit > 0 and remaining is not None:
                bucket = buckets.setdefault(dimension, Bucket(limit, -math.inf, now))
                bucket.limit = limit
                bucket.tat = learned_tat(bucket.tat, now, limit, remaining)
                self.seen = now
        shown = counts_in_windows(
            limits.requests_limit, limits.requests_remaining, limits.requests_reset_s
        )
        if shown is None:
            return
        assert limits.requests_remaining is not None
        assert limits.requests_reset_s is not None
        if shown:
            self.window_seen = now
        self.window_end, self.window_left = window_learn(
            self.window_end,
            self.window_left,
            now,
            limits.requests_remaining,
            limits.requests_reset_s,
        )
