"""Configuration: what every model shares: strict types, names, durations and their bounds.

Each numeric setting is bounded below and above as a user would expect (the
reference table shows the range): a duration of ``1e308`` would make time limits
infinite, one of ``1e-300`` a busy loop. An rpm window is checked against its rpm
(`_check_window`); tables of defaults are laid under the entries they serve with
`deep_merge`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from polygate_celery.core.terms import RpmWindow

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
"""Source, scope and quota names: lowercase (environment keys are case-folded), key-safe."""

Seconds = Annotated[float, Field(allow_inf_nan=False)]
"""A duration; each field bounds it as a user would expect (the reference table shows how)."""
HOUR, DAY = 3600, 86_400
WEEK, MONTH = 7 * DAY, 30 * DAY
MAX_CONCURRENCY = 10_000
MAX_RPM, MAX_TPM = 10_000_000, 10_000_000_000
MAX_DB = 2**31 - 1  # Redis counts its databases in a C int
MIN_BODY_BYTES, MAX_BODY_BYTES = 1024, 2**30


class _Strict(BaseModel):
    """Unknown keys are refused, and values are taken as typed: a TOML ``true`` is not
    the number 1, nor ``"yes"`` a boolean, nor ``"30"`` a number (`polygate_celery.config.
    environment` reads environment variables, text by nature, into typed values first)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, strict=True)


def _check_window(window: RpmWindow | None, rpm: int | None, remedy: str) -> None:
    """A sliding window must have an rpm of its own to count."""
    if window not in (None, "bucket") and rpm is None:
        raise ValueError(f"rpm_window applies to rpm: {remedy}")


RPM_WINDOW_HELP = (
    "how rpm is counted: bucket (a minute's worth at once, then evenly, as providers that "
    "refill continuously count) or sliding (at most rpm in any minute); unset: as a "
    "bucket, unless the provider's rate-limit reset headers show that it counts in "
    "windows, whose ends requests then follow"
)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, merging nested tables instead of replacing them."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
