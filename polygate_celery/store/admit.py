"""Store layer: what one admission decided, as both stores hand it back.

An admission answers its caller (a `Grant` or a `Denial`) and may do two things
the caller's process must hear of: a permit it had been handed at another source
goes on to the next waiter there (a waiter of this process is woken here, without
a message), and taking a breaker's half-open probe turns the breaker (said once,
fleet-wide, by the process that took it). The memory store builds an
`AdmitResult` from its state, the Redis store decodes one from admit.lua's reply
(`redis.codec`); `carry_out` does the rest the same way for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from polygate_celery.store.base import Denial, Grant
from polygate_celery.store.changes import log_half_open
from polygate_celery.store.releases import ReleaseHub


@dataclass(frozen=True, slots=True)
class HalfOpen:
    """An admission took the probe of `source`'s breaker, turning it from open to
    half-open after `open_s` seconds open (None if not on record); `error` is the
    source's last error on record."""

    source: str
    open_s: float | None
    error: str | None


class AdmitResult(NamedTuple):
    """One admission: its `answer`; the waiters of this process a permit was handed on
    to, ``(call id, source)`` each; the breaker it turned half-open, if any. (A tuple:
    one is made per admission, and a frozen dataclass's field-by-field `__init__`
    costs some twice as much.)"""

    answer: Grant | Denial
    handed_on: tuple[tuple[str, str], ...] = ()
    half_open: HalfOpen | None = None


def carry_out(result: AdmitResult, releases: ReleaseHub) -> Grant | Denial:
    """Wake the waiters a permit was handed on to and say a breaker turned half-open;
    the answer."""
    for call_id, source in result.handed_on:
        releases.wake_call(call_id, source)
    if result.half_open is not None:
        turned = result.half_open
        log_half_open(turned.source, turned.open_s, turned.error)
    return result.answer
