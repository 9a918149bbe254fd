"""Store layer: the log lines of a source's or a scope's state changes, written once fleet-wide.

A breaker opening, a source paused by a long Retry-After, a scope answering
again: each is decided by one atomic settle, so the process whose settle made
the change is the one that says so, and the fleet's logs hold the line once
instead of once per worker that noticed. The settle reports what changed
(`SettleChanges`); the line names the source and the attempt's error (its
classified kind, status and reason, never a provider body or a key). A breaker
turning half-open is decided by the one admission that takes its probe, so the
process that admitted the probe says so (`log_half_open`), naming the source's
last error on record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from polygate_celery.store.base import Settlement

logger = logging.getLogger("polygate_celery")

# A Retry-After pause shorter than this is a routine rate limit, not news.
PAUSE_NOTED_S = 5.0

BreakerChange = Literal["opened", "reopened", "closed"]


@dataclass(frozen=True, slots=True)
class SettleChanges:
    """What one settle changed: the breaker's mode, a fresh pause (the source was not
    paused before it), and whether a success ended the scope's stall on record (its gate
    closed, or opened by time less than a minute ago)."""

    breaker: BreakerChange | None = None
    open_for_s: float = 0.0  # how long an opened breaker stays open
    paused_for_s: float | None = None
    gate_opened: bool = False


def log_changes(settlement: Settlement, changes: SettleChanges) -> None:
    """Write one line per change `settlement` caused: a WARNING when a source goes down
    or is paused, an INFO when it serves again."""
    name = settlement.source.name
    error = settlement.error or settlement.effect.value
    if changes.breaker == "opened":
        logger.warning(
            "source %r is failing (%s): breaker open, no requests to it for %.0f s "
            "but one probe then",
            name,
            error,
            changes.open_for_s,
        )
    elif changes.breaker == "reopened":
        logger.warning(
            "source %r still failing: its probe failed (%s); breaker open again for %.0f s",
            name,
            error,
            changes.open_for_s,
        )
    elif changes.breaker == "closed":
        logger.info("source %r recovered: a request succeeded; breaker closed", name)
    if changes.paused_for_s is not None and changes.paused_for_s >= PAUSE_NOTED_S:
        logger.warning(
            "source %r paused fleet-wide for %.0f s by its Retry-After (%s)",
            name,
            changes.paused_for_s,
            error,
        )
    if changes.gate_opened:
        logger.info(
            "scope %r answers again (source %r succeeded): its gate is open",
            settlement.scope,
            name,
        )


def log_half_open(source: str, open_for_s: float | None, error: str | None) -> None:
    """The breaker of `source` turned half-open: this admission took its one probe, after
    it was open `open_for_s` (None: not on record). `error` is the source's last error."""
    after = f"after {open_for_s:.0f} s open" if open_for_s is not None else "after its cooldown"
    logger.warning(
        "source %r breaker half-open: one probe request %s (last error: %s)",
        source,
        after,
        error or "none",
    )
