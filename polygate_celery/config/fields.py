"""Configuration: what every model shares: strict types, names, durations and their bounds.

Each numeric setting is bounded below and above as a user would expect (the
reference table shows the range): a duration of ``1e308`` would make time limits
infinite, one of ``1e-300`` a busy loop.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

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
