"""Edge: what a run of `polygate-celery demo` did, and the summary it ends with.

The tasks the pipeline sent, tracked by scope from their Celery states (`Tracker`);
the counts a run returns (`Report`); and the summary printed at the end, in which
every task is accounted for, with what the provider's outage and rate limit did,
read from the simulated provider's journal.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from polygate_celery.demo.display import ScopeState

SCOPES = ("ocr", "embed", "summarise")
SOURCES = {"vision": "vision-ocr", "embedder": "embedder", "summariser": "summariser",
           "summariser_small": "summariser-small"}  # fmt: skip
PROVIDER_RPM = 30  # the summariser's real quota; the configuration says 60: 429s to handle
MAX_DELAY_S = 8  # the demo's deferral.max_delay_s: a deferred task is back within this
TERMINAL = {"SUCCESS", "FAILURE", "REVOKED"}
SUMMARISERS = ("summariser", "summariser-small")


@dataclass
class Tracker:
    """Every task the demo sent, by scope, and what became of it."""

    ids: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in SCOPES})
    states: dict[str, str] = field(default_factory=dict)
    deferrals: Counter[str] = field(default_factory=Counter)
    ever_deferred: set[str] = field(default_factory=set)
    deferral_times: list[tuple[float, str]] = field(default_factory=list)  # (t, scope)

    def name(self, step: str, page: int) -> str:
        task_id = f"{step}-{uuid.uuid4().hex[:12]}"
        self.ids["summarise" if step == "summarise" else step].append(task_id)
        return task_id

    @property
    def total(self) -> int:
        return sum(len(ids) for ids in self.ids.values())

    def poll(self, app: Any, now: float) -> None:
        """Read every unfinished task's state; `now` (the provider's time) dates the
        deferrals seen since the last poll."""
        for scope, ids in self.ids.items():
            for task_id in ids:
                if self.states.get(task_id) in TERMINAL:
                    continue
                result = app.AsyncResult(task_id)
                state = result.state
                self.states[task_id] = state
                if state == "DEFERRED" and isinstance(result.info, dict):
                    self.ever_deferred.add(task_id)
                    seen = int(result.info.get("deferrals", 0))
                    new = seen - self.deferrals[task_id]
                    if new > 0:
                        self.deferrals[task_id] = seen
                        self.deferral_times += [(now, scope)] * new

    def counts(self, scope: str) -> Counter[str]:
        states = Counter(self.states.get(i, "PENDING") for i in self.ids[scope])
        return Counter(
            succeeded=states["SUCCESS"],
            deferred=states["DEFERRED"],
            failed=states["FAILURE"] + states["REVOKED"],
            waiting=len(self.ids[scope]) - states["SUCCESS"] - states["DEFERRED"]
            - states["FAILURE"] - states["REVOKED"],
        )  # fmt: skip

    def scope_state(self, scope: str) -> ScopeState:
        c = self.counts(scope)
        return ScopeState(
            scope,
            len(self.ids[scope]),
            c["succeeded"],
            c["failed"],
            c["deferred"],
            sum(self.deferrals[i] for i in self.ids[scope]),
        )

    @property
    def done(self) -> bool:
        return all(self.states.get(i) in TERMINAL for ids in self.ids.values() for i in ids)


@dataclass(frozen=True, slots=True)
class Report:
    """What a run of the demo did, counted from the tasks' states and the provider's journal."""

    tasks: int
    succeeded: int
    failed: int
    deferred_tasks: int
    deferrals: int
    limited: int  # answers 429
    down: int  # answers 503
    recovery_s: float | None  # the outage's end to the first summary served after it
    elapsed_s: float

    @property
    def lost(self) -> int:
        return self.tasks - self.succeeded - self.failed


def _report(
    tracker: Tracker, journal: Sequence[Any], outage: tuple[float, float] | None, started: float
) -> Report:
    states = [tracker.scope_state(scope) for scope in SCOPES]
    return Report(
        tasks=tracker.total,
        succeeded=sum(s.succeeded for s in states),
        failed=sum(s.failed for s in states),
        deferred_tasks=len(tracker.ever_deferred),
        deferrals=sum(tracker.deferrals.values()),
        limited=sum(1 for e in journal if e.status == 429),
        down=sum(1 for e in journal if e.status == 503),
        recovery_s=_recovery_s(journal, outage),
        elapsed_s=time.monotonic() - started,
    )


def _recovery_s(journal: Sequence[Any], outage: tuple[float, float] | None) -> float | None:
    """Seconds from the outage's end to the first summary served after it, if any."""
    if outage is None:
        return None
    served = [e.at for e in journal if e.model in SUMMARISERS and e.status == 200]
    after = [at for at in served if at >= outage[1]]
    return min(after) - outage[1] if after else None


def _outage_at(provider: Any, outage: tuple[float, float]) -> tuple[float, float] | None:
    """The outage in the provider's time, once the summariser's first request set it."""
    first = provider.first_request_at("summariser")
    return None if first is None else (first + outage[0], first + outage[1])


def _summary(
    tracker: Tracker, provider: Any, out: TextIO, elapsed: float, outage: tuple[float, float]
) -> None:
    rows = [("scope", "tasks", "succeeded", "failed", "deferred", "deferrals")]
    for scope in SCOPES:
        c = tracker.counts(scope)
        ids = tracker.ids[scope]
        deferred = sum(1 for i in ids if i in tracker.ever_deferred)
        deferrals = sum(tracker.deferrals[i] for i in ids)
        rows.append((scope, str(len(ids)), str(c["succeeded"]), str(c["failed"]),
                     str(deferred), str(deferrals)))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"\nDone in {elapsed:.0f} s.", file=out)
    for row in rows:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        print("  " + "  ".join(cells), file=out)
    by_model = Counter((e.model, e.status) for e in provider.journal)
    print("\n  provider      requests   200   429   503", file=out)
    for model in SOURCES.values():
        total = sum(n for (m, _), n in by_model.items() if m == model)
        print(f"  {model:16s} {total:6d} {by_model[(model, 200)]:5d} {by_model[(model, 429)]:5d}"
              f" {by_model[(model, 503)]:5d}", file=out)  # fmt: skip
    print("", file=out)
    for line in recovery_lines(provider.journal, _outage_at(provider, outage)):
        print(line, file=out)
    print(closing_line(tracker), file=out)


def recovery_lines(journal: Sequence[Any], outage: tuple[float, float] | None) -> list[str]:
    """What the outage and the rate limit did, from the provider's journal."""
    lines = []
    if outage is None:
        lines.append("No summary was requested, so the summarisers never went down.")
    else:
        down = sum(1 for e in journal if e.model in SUMMARISERS and e.status == 503)
        line = (
            f"The summarisers were down from t={outage[0]:.1f} s (the first summary request) "
            f"to t={outage[1]:.1f} s: {down} requests answered 503"
        )
        recovery = _recovery_s(journal, outage)
        if recovery is not None:
            line += (
                f"; the first summary after it was served at t={outage[1] + recovery:.1f} s, "
                f"{recovery:.1f} s after the recovery (a deferred task comes back "
                f"within deferral.max_delay_s = {MAX_DELAY_S} s, plus jitter)."
            )
        else:
            line += "; no summary was requested after it."
        lines.append(line)
    limited = [e for e in journal if e.model == "summariser" and e.status == 429]
    if limited:
        lines.append(
            f"The summariser answered 429 {_times(len(limited))} (its real quota is "
            f"{PROVIDER_RPM} a minute): each paused it fleet-wide until its Retry-After; the "
            "tasks waiting on it were deferred to that time, not retried."
        )
    return lines


def closing_line(tracker: Tracker) -> str:
    """What became of the tasks, from what the demo saw (not what it hoped to show)."""
    succeeded = sum(tracker.counts(s)["succeeded"] for s in SCOPES)
    failed = sum(tracker.counts(s)["failed"] for s in SCOPES)
    accounted = succeeded + failed
    line = f"{accounted} of {tracker.total} tasks accounted for: {succeeded} succeeded"
    line += f", {failed} failed" if failed else ""
    deferred = len(tracker.ever_deferred)
    if deferred:
        again = sum(1 for i in tracker.ever_deferred if tracker.states.get(i) == "SUCCESS")
        line += (
            f"; {deferred} were deferred ({sum(tracker.deferrals.values())} deferrals in all), "
            f"{again} of them ran again and succeeded"
        )
    else:
        line += "; none was deferred"
    lost = tracker.total - accounted
    return line + (f"; {lost} NOT accounted for." if lost else "; none lost.")


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"
