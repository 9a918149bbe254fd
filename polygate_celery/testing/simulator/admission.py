"""Testing: per-model admission for the simulator — concurrency and rate limits.

Rates are counted as 60 s sliding windows (``rate_limiter = "window"``) or as
token buckets refilled continuously (``"bucket"``, a GCRA per dimension: a full
minute's allowance at once after an idle minute, then an even refill, as OpenAI
and Anthropic describe theirs). Time is passed in (seconds since the server
started), so the arithmetic is plain and the hint it returns is truthful:
retrying after `retry_after_s` (rounded up to whole seconds by the server) finds
the limit open again. `limits` reports what a provider's rate-limit headers say.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

from polygate_celery.testing.simulator.behaviour import ModelBehaviour

WINDOW_S = 60.0
# The hint for a request refused because the model is at capacity.
CAPACITY_RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class Limit:
    """One dimension's state as a provider announces it: limit, remaining, full reset."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was not admitted, and when trying again would be worth it."""

    outcome: str  # "429-capacity" | "429-rpm" | "429-tpm"
    retry_after_s: float


class Admission:
    """One model's in-flight count, peak concurrency and rate window (arrival time, tokens).

    The lock lets a test thread read `in_flight` and `peak` while the server runs.
    """

    def __init__(self, behaviour: ModelBehaviour) -> None:
        self._behaviour = behaviour
        self._lock = threading.Lock()
        self._in_flight = 0
        self._peak = 0
        self._window: deque[tuple[float, int]] = deque()
        self._tat = {"requests": 0.0, "tokens": 0.0}  # bucket: theoretical arrival times

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def peak(self) -> int:
        with self._lock:
            return self._peak

    def admit(self, now: float, tokens: int, *, charge: bool = True) -> Refusal | None:
        """Take a slot (and, when `charge`, a place in the rate window) or say why not.

        Checks and commits together, so a refused request leaves no trace.
        """
        with self._lock:
            capacity = self._behaviour.capacity
            if capacity is not None and self._in_flight >= capacity:
                return Refusal("429-capacity", CAPACITY_RETRY_AFTER_S)
            if charge:
                refusal = self._rate_refusal(now, tokens)
                if refusal is not None:
                    return refusal
                self._window.append((now, tokens))
                self._charge(now, tokens)
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
            return None

    def release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def limits(self, now: float) -> dict[str, Limit]:
        """Each limited dimension ("requests", "tokens") as of `now`."""
        with self._lock:
            self._expire(now)
            found = {}
            for name, limit in (("requests", self._behaviour.rpm), ("tokens", self._behaviour.tpm)):
                if limit is not None:
                    found[name] = self._limit(name, limit, now)
            return found

    def _limit(self, name: str, limit: int, now: float) -> Limit:
        if self._behaviour.rate_limiter == "bucket":
            ahead = max(0.0, self._tat[name] - now)
            spent = ahead * limit / WINDOW_S
            return Limit(limit, max(0, math.floor(limit - spent)), ahead)
        entries = list(self._window)
        used = len(entries) if name == "requests" else sum(n for _, n in entries)
        reset = entries[-1][0] + WINDOW_S - now if entries else 0.0
        return Limit(limit, max(0, limit - used), max(0.0, reset))

    def _charge(self, now: float, tokens: int) -> None:
        for name, cost, limit in self._buckets(tokens):
            self._tat[name] = max(self._tat[name], now) + cost * WINDOW_S / limit

    def _buckets(self, tokens: int) -> list[tuple[str, float, int]]:
        if self._behaviour.rate_limiter != "bucket":
            return []
        found = []
        if self._behaviour.rpm is not None:
            found.append(("requests", 1.0, self._behaviour.rpm))
        if self._behaviour.tpm is not None:
            found.append(("tokens", float(min(tokens, self._behaviour.tpm)), self._behaviour.tpm))
        return found

    def _expire(self, now: float) -> None:
        window = self._window
        while window and window[0][0] <= now - WINDOW_S:
            window.popleft()

    def _rate_refusal(self, now: float, tokens: int) -> Refusal | None:
        if self._behaviour.rate_limiter == "bucket":
            return self._bucket_refusal(now, tokens)
        window = self._window
        while window and window[0][0] <= now - WINDOW_S:
            window.popleft()
        rpm_wait = self._rpm_wait(now)
        tpm_wait = self._tpm_wait(now, tokens)
        if rpm_wait is None and tpm_wait is None:
            return None
        # Truthful: the request fits only once both windows admit it.
        wait = max(rpm_wait or 0.0, tpm_wait or 0.0)
        return Refusal("429-rpm" if rpm_wait is not None else "429-tpm", wait)

    def _bucket_refusal(self, now: float, tokens: int) -> Refusal | None:
        """GCRA: a request conforms while its cost keeps the TAT within a minute of now."""
        waits = {}
        for name, cost, limit in self._buckets(tokens):
            over = max(self._tat[name] - now, 0.0) + cost * WINDOW_S / limit - WINDOW_S
            if over > 0:  # (exact for a full bucket: no rounding)
                waits[name] = over
        if not waits:
            return None
        outcome = "429-rpm" if "requests" in waits else "429-tpm"
        return Refusal(outcome, max(waits.values()))

    def _rpm_wait(self, now: float) -> float | None:
        rpm = self._behaviour.rpm
        if rpm is None or len(self._window) < rpm:
            return None
        # Room appears when all but rpm - 1 of the current entries have left.
        freeing = self._window[len(self._window) - rpm][0]
        return freeing + WINDOW_S - now

    def _tpm_wait(self, now: float, tokens: int) -> float | None:
        tpm = self._behaviour.tpm
        if tpm is None:
            return None
        used = sum(n for _, n in self._window)
        if used + tokens <= tpm:
            return None
        if tokens > tpm:
            return WINDOW_S  # never fits; the longest honest-looking hint
        for arrived, n in self._window:
            used -= n
            if used + tokens <= tpm:
                return arrived + WINDOW_S - now
        return WINDOW_S  # unreachable: an empty window always fits tokens <= tpm
