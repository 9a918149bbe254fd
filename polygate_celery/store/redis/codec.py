"""Store layer (Redis): what admit.lua and settle.lua are sent per call, and how their
replies read.

The fixed part of each command (keys, the source's terms, the constants the scripts
share with `core`) is packed once (`scripts._Commands`); here is the part a call
changes, in the order the scripts' headers give, and the one reading of each reply
(a malformed one is a `StoreReplyError`, `errors.reading`).
"""

from __future__ import annotations

import functools
import math
from enum import IntEnum
from typing import Any

from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.quota import counts_in_windows
from polygate_celery.core.standing import PLAIN, Standing, tag_text
from polygate_celery.store.admit import AdmitResult, HalfOpen
from polygate_celery.store.base import (
    AdmitRequest,
    BlockReason,
    Denial,
    Grant,
    Settlement,
    WaitMode,
)
from polygate_celery.store.changes import BreakerChange, SettleChanges, log_changes
from polygate_celery.store.redis.errors import reading

# admit.lua's ARGV[5]: how the caller waits if refused (see its header).
WAIT_ARG: dict[WaitMode, bytes] = {
    WaitMode.NONE: b"0",
    WaitMode.JOIN: b"1",
    WaitMode.QUEUED: b"2",
    WaitMode.BOOKED: b"3",
}


class _Admitted(IntEnum):
    """The first item of admit.lua's reply: which kind of answer follows."""

    DENIED = 0  # reopen_in_s, then (name, reason, error) per refusing candidate
    GRANTED = 1  # name, admitted_at, then (call, source) per waiter handed on to
    GATED = 2  # gated_for_s, reset, error
    DENIED_BOOKED = 3  # reopen_in_s, booked_in_s, arrival, tag, then as DENIED
    PROBE = 4  # name, admitted_at, turned, open_s, error, then as GRANTED


# The kinds by their number: an unknown one is a `KeyError` (a bad reply), found in a
# dictionary rather than by the enum's own lookup, which costs more per call.
_KINDS: dict[int, _Admitted] = {kind.value: kind for kind in _Admitted}

_BREAKER_CHANGES: dict[str, BreakerChange] = {
    "opened": "opened",
    "reopened": "reopened",
    "closed": "closed",
}
_NOT_ANNOUNCED = (b"0", b"0")


def fmt(x: float) -> str:
    """A number as the scripts read it back exactly."""
    return repr(float(x))


def encode_admit(request: AdmitRequest, wait: WaitMode, now: bytes) -> tuple[bytes, ...]:
    """admit.lua's per-call arguments, ARGV[1..10] (`wait`: the request's, read once)."""
    return (
        now,
        request.permit_id.encode(),
        str(request.est_tokens).encode(),
        request.call_id.encode(),
        WAIT_ARG[wait],
        fmt(request.probe_lease_s).encode() if request.gate else b"",
        fmt(request.claim_s).encode(),
        fmt(request.book_within_s).encode() if request.book_within_s > 0 else b"",
        b"" if request.standing is PLAIN else standing_arg(request.standing),
        place_arg(request.arrival, request.tag),
    )


def place_arg(arrival: int | None, tag: float | None) -> bytes:
    """A call's place as admit.lua's ARGV[10] reads it: "<arrival>" or "<arrival> <tag>",
    "" for none yet (the tag written as the script wrote it, so a booking is named by it)."""
    place = "" if arrival is None else str(arrival)
    return (place if tag is None else f"{place} {tag_text(tag)}").encode()


@functools.lru_cache(maxsize=1024)
def standing_arg(standing: Standing) -> bytes:
    """A caller's standing as admit.lua's ARGV[9] reads it (see its header): `PLAIN`
    itself (one class at most, no tenant) is sent as "", by `encode_admit`; a standing
    equal to it (the top class of two or more, no tenant, no floors) is sent in full: it
    may take a lower class's booked slot (admit_booking.lua)."""
    floors = ",".join(fmt(f) for f in standing.floors)
    text = f"{standing.rank}|{fmt(standing.weight)}|{standing.tenant}|{floors}"
    caps = standing.caps
    if caps is not None:  # its tenant's caps (0: none), with the tenant's keys (scripts.py)
        text += f"|{caps.max_concurrency or 0},{caps.rpm or 0},{caps.tpm or 0}"
    return text.encode()


def decode_admit(reply: Any, request: AdmitRequest, lease_s: float) -> AdmitResult:
    """admit.lua's reply, read once (see its header)."""
    with reading("admit", reply):
        if reply[0] == 1 and len(reply) == 3:  # most grants: nothing handed on
            return AdmitResult(Grant(str(reply[1]), request.permit_id, float(reply[2]), lease_s))
        kind = _KINDS[int(reply[0])]
        if kind is _Admitted.GRANTED or kind is _Admitted.PROBE:
            probe = kind is _Admitted.PROBE
            handed = reply[6:] if probe else reply[3:]
            grant = Grant(str(reply[1]), request.permit_id, float(reply[2]), lease_s, probe=probe)
            turned = None
            if probe and str(reply[3]) == "1":  # this admission turned it half-open
                opened = float(reply[4]) if reply[4] else None
                turned = HalfOpen(str(reply[1]), opened, str(reply[5]) or None)
            return AdmitResult(grant, _pairs(handed), turned)
        if kind is _Admitted.GATED:
            said = str(reply[3]) if len(reply) > 3 else ""
            gated = float(reply[1])
            return AdmitResult(
                Denial(
                    gated,
                    (),
                    gated_for_s=gated,
                    gated_reset=str(reply[2]) == "1",
                    gated_error=said or None,
                )
            )
        booked = kind is _Admitted.DENIED_BOOKED  # then its slot, arrival and tag
        named = reply[5:] if booked else reply[2:]
        names, said = named[::3], named[2::3]
        reasons: list[tuple[str, BlockReason]] = [
            (str(name), reason) for name, reason in zip(names, named[1::3], strict=True)
        ]
        errors = tuple((str(name), str(e)) for name, e in zip(names, said, strict=True) if e)
        return AdmitResult(
            Denial(
                float(reply[1]) if reply[1] else None,
                tuple(reasons),
                booked_in_s=float(reply[2]) if booked else None,
                errors=errors,
                arrival=int(reply[3]) if booked else None,
                tag=float(reply[4]) if booked and reply[4] else None,
            )
        )


def _pairs(items: Any) -> tuple[tuple[str, str], ...]:
    """``(call id, source)`` pairs of a flat reply tail."""
    if not items:  # (most grants hand nothing on)
        return ()
    return tuple(
        (str(call_id), str(source)) for call_id, source in zip(items[::2], items[1::2], strict=True)
    )


def encode_settle(settlement: Settlement, now: bytes) -> tuple[bytes, ...]:
    """settle.lua's per-call arguments, ARGV[1..17]."""
    pause = settlement.pause_s
    return (
        now,
        settlement.permit_id.encode(),
        settlement.effect.value.encode(),
        b"1" if settlement.congested else b"0",
        fmt(pause).encode() if pause is not None and math.isfinite(pause) else b"",
        str(settlement.est_tokens).encode(),
        str(settlement.used_tokens).encode(),
        fmt(settlement.admitted_at).encode(),
        *_announced(settlement.limits),
        (settlement.error or "").encode(),
        b"" if settlement.rank is None else str(settlement.rank).encode(),
        _correction(settlement),
    )


def _correction(settlement: Settlement) -> bytes:
    """settle.lua's ARGV[17]: the tenant whose tag the tokens used move, if they differ
    from the estimate (see its header)."""
    standing = settlement.standing
    if standing is PLAIN or max(settlement.used_tokens, 1) == max(settlement.est_tokens, 1):
        return b""
    return f"{standing.rank}|{standing.tenant}|{fmt(standing.weight)}".encode()


def decode_settle(reply: Any, settlement: Settlement) -> Any:
    """settle.lua's result (0, 1 or a waiter's call id); the state changes it reported
    alongside, if any, logged (see its header)."""
    if not isinstance(reply, list):
        return reply
    with reading("settle", reply):
        result, breaker, open_for, pause, gate = reply
        mode = breaker.decode() if isinstance(breaker, bytes) else str(breaker)
        fresh = pause.decode() if isinstance(pause, bytes) else str(pause)
        changes = SettleChanges(
            breaker=_BREAKER_CHANGES.get(mode),
            open_for_s=float(open_for),
            paused_for_s=float(fresh) if fresh else None,
            gate_opened=gate in (b"1", "1"),
        )
    log_changes(settlement, changes)
    return result


def _announced(limits: RateLimits | None) -> tuple[bytes, ...]:
    """The provider's announced limits as settle.lua reads them (a limit of 0: none), then
    the requests reset and whether it shows a window (see settle.lua)."""

    def pair(limit: int | None, remaining: int | None) -> tuple[bytes, bytes]:
        if not limit or limit <= 0 or remaining is None:
            return _NOT_ANNOUNCED
        return str(limit).encode(), str(remaining).encode()

    if limits is None:
        return (*_NOT_ANNOUNCED * 2, b"", b"")
    shown = counts_in_windows(
        limits.requests_limit, limits.requests_remaining, limits.requests_reset_s
    )
    window: tuple[bytes, bytes] = (b"", b"")
    if shown is not None and limits.requests_reset_s is not None:
        window = (fmt(limits.requests_reset_s).encode(), b"1" if shown else b"0")
    return (
        *pair(limits.requests_limit, limits.requests_remaining),
        *pair(limits.tokens_limit, limits.tokens_remaining),
        *window,
    )
