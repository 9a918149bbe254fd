"""Decision core: the one backoff and jitter function every kind of call shares."""

from __future__ import annotations


def jitter(u: float) -> float:
    """Map a uniform draw ``u`` in [0, 1) onto the jitter factor in [0.5, 1.0)."""
    return 0.5 + 0.5 * u


def backoff_ceiling(n: int, base_s: float, max_s: float) -> float:
    """The backoff after the ``n``-th failure before its jitter: ``min(max_s, base_s *
    2**(n-1))``; ``n`` below 1 counts as 1."""
    n = max(n, 1)
    # Cap the exponent before computing it: 2**n overflows a float past ~1024.
    exponent = min(n - 1, 64)
    return min(max_s, base_s * 2.0**exponent)


def backoff_delay(n: int, base_s: float, max_s: float, u: float) -> float:
    """Delay before the next attempt after the ``n``-th failure (SPEC §3 rule 4).

    ``min(max_s, base_s * 2**(n-1)) * uniform(0.5, 1.0)``, where ``u`` is the
    uniform draw; with ``u = 0`` the factor is 0.5. ``n`` below 1 counts as 1, so
    a 429 that did not burn the retry budget stays at the base tier.
    """
    return backoff_ceiling(n, base_s, max_s) * jitter(u)
