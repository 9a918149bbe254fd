"""Edge (CLI): plain, aligned text tables and the units the commands print."""

from __future__ import annotations

import math
from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """`rows` under `headers`, columns two spaces apart; `numeric` columns align right."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if i in numeric else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(row) for row in rows)])


def duration(seconds: float) -> str:
    """A short duration: ``4.2s``, ``38s``, ``12m05s``, ``3h20m``."""
    if not math.isfinite(seconds):
        return "inf"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def amount(value: float) -> str:
    """A count of requests or tokens, about three digits: ``42``, ``5.7k``, ``100k``, ``1.2M``."""
    for unit, size in (("M", 1_000_000), ("k", 1000)):
        if value >= size:
            scaled = value / size
            text = f"{scaled:.1f}" if scaled < 100 else f"{scaled:.0f}"
            return text.removesuffix(".0") + unit
    return f"{value:.0f}"
