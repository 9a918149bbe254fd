"""Decision core: per-kind policy, the only thing that differs between chat, embedding and OCR."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["chat", "embedding", "ocr"]
KINDS: tuple[Kind, ...] = ("chat", "embedding", "ocr")


@dataclass(frozen=True, slots=True)
class KindPolicy:
    """How one kind of call treats a 429.

    With `rate_limit_exempt`, a 429 does not burn the retry budget; its time is
    stall time and the loop checks the stall verdict at the top of every
    iteration. Without it, a 429 is a failure like any other and the only stall
    verdict comes from waiting for a runnable source.
    """

    kind: Kind
    rate_limit_exempt: bool


DEFAULT_RATE_LIMIT_EXEMPT: dict[Kind, bool] = {"chat": True, "embedding": False, "ocr": False}


def policy_for(kind: Kind, rate_limit_exempt: bool | None = None) -> KindPolicy:
    """The policy of `kind`, with the per-scope override when one is set."""
    if rate_limit_exempt is None:
        rate_limit_exempt = DEFAULT_RATE_LIMIT_EXEMPT[kind]
    return KindPolicy(kind=kind, rate_limit_exempt=rate_limit_exempt)
