"""The soak tier: heavy fault trials at full size under ``make soak``, smaller in CI.

``POLYGATE_SOAK=1`` (set by ``make soak``) selects the full sizes; every test of
the tier then records its figures with the `figures` fixture, and the session
writes them to ``benchmarks/results/soak.md``, the committed run.
"""

from __future__ import annotations

import os

SOAK = os.environ.get("POLYGATE_SOAK") == "1"


def size(ci: int, soak: int) -> int:
    """`soak` under ``make soak``, else `ci`."""
    return soak if SOAK else ci
