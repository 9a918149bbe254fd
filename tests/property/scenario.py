"""Random governed-call scenarios for the property tests, and a runner that records everything.

Durations are kept in proportion (timeouts up to 20 s, windows up to 60 s, polls
at least a fiftieth of the window) so a scenario runs a bounded number of loop
iterations and the suite stays fast.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from polygate_celery import (
    AllSourcesExhausted,
    CallResult,
    Gateway,
    MemoryStore,
    SourceFatalError,
    parse_config,
)
from polygate_celery.core.outcome import AttemptRecord
from polygate_celery.telemetry import AttemptEvent, Event, VerdictEvent, WaitEvent
from polygate_celery.testing import ScriptedSource, Step, VirtualClock, steps

KINDS = ("chat", "embedding", "ocr")


@dataclass(frozen=True)
class Scenario:
    kind: str
    sources: dict[str, dict[str, Any]]
    scripts: dict[str, list[Step]]
    scope: dict[str, Any]
    seed: int
    progress_every_s: float | None  # another worker's successes, every so often ...
    progress_until_s: float  # ... until this time


@dataclass
class Run:
    scenario: Scenario
    verdict: str
    ended_s: float
    trail: tuple[AttemptRecord, ...]
    events: list[Event]
    marks: list[float]
    permits_in_use: int
    max_call_s: float
    window: float
    exempt: bool
    timeouts: dict[str, float] = field(default_factory=dict)


def step_strategy(timeout_s: float, waiting: bool = False) -> st.SearchStrategy[Step]:
    """Steps weighted towards what makes calls wait: 429s with hints, timeouts, 5xx.

    With `waiting`, request-level failures are left out and 429s with hints
    dominate, so most calls end up waiting for a runnable source.
    """
    duration = st.floats(0, timeout_s * 1.3, allow_nan=False)
    ok = st.builds(lambda d: steps.ok(duration_s=d), duration)
    limited = st.builds(
        lambda d, r: steps.rate_limited(duration_s=d, retry_after_s=r),
        duration,
        st.none() | st.floats(0, 120),
    )
    server_error = st.builds(lambda d: steps.server_error(duration_s=d), duration)
    request_level = st.one_of(
        st.builds(lambda d: steps.fatal(duration_s=d), duration),
        st.builds(lambda d: steps.source_rejected(duration_s=d), duration),
        st.builds(lambda d: steps.auth_rejected(duration_s=d), duration),
    )
    if waiting:
        hinted = st.builds(
            lambda d, r: steps.rate_limited(duration_s=d, retry_after_s=r),
            duration,
            st.floats(10, 120),
        )
        return st.one_of(hinted, limited, server_error, st.just(steps.timeout()), hinted, ok)
    return st.one_of(
        limited, ok, st.just(steps.timeout()), server_error, limited, server_error, request_level
    )


@st.composite
def scenarios(draw: st.DrawFn, *, waiting: bool = False) -> Scenario:
    kind = draw(st.sampled_from(KINDS))
    window = draw(st.floats(2, 60))
    base = draw(st.floats(0.1, 5))
    scope: dict[str, Any] = {
        "max_attempts": draw(st.integers(3, 6) if waiting else st.integers(1, 5)),
        "stall_window_s": window,
        "backoff_base_s": base,
        "backoff_max_s": draw(st.floats(base, 20)),
        "poll_interval_s": draw(st.floats(window / 50, 5)),
        "retry_after_cap_s": 3600,
    }
    if draw(st.booleans()):
        scope["max_call_s"] = draw(st.floats(1, 300))
    if draw(st.booleans()):
        scope["rate_limit_exempt"] = draw(st.booleans())
    sources: dict[str, dict[str, Any]] = {}
    scripts: dict[str, list[Step]] = {}
    for name in ("a", "b")[: draw(st.integers(1, 2))]:
        timeout_s = draw(st.floats(1, 20))
        sources[name] = {
            "timeout_s": timeout_s,
            "max_concurrency": draw(st.integers(1, 2)),
            "breaker": {
                "failure_threshold": draw(st.integers(1, 5)),
                "cooldown_s": draw(st.floats(1, 30)),
                "auth_cooldown_s": draw(st.floats(1, 100)),
            },
        }
        scripts[name] = draw(st.lists(step_strategy(timeout_s, waiting), min_size=1, max_size=8))
    keeper = draw(st.none() | st.floats(1, 2 * window))
    return Scenario(
        kind=kind,
        sources=sources,
        scripts=scripts,
        scope=scope,
        seed=draw(st.integers(0, 2**32 - 1)),
        progress_every_s=keeper,
        progress_until_s=draw(st.floats(0, 200)),
    )


def run_scenario(scenario: Scenario) -> Run:
    return asyncio.run(_run(scenario))


async def _run(sc: Scenario) -> Run:
    config = parse_config(
        {
            "sources": sc.sources,
            "scopes": {"s": {"kind": sc.kind, "sources": list(sc.sources), **sc.scope}},
        }
    )
    clock = VirtualClock()
    store = MemoryStore(clock)
    events: list[Event] = []
    adapters = {n: ScriptedSource(clock, itertools.cycle(s)) for n, s in sc.scripts.items()}
    gw = Gateway(
        config,
        adapters,
        store=store,
        clock=clock,
        random=random.Random(sc.seed).random,
        hooks=[events.append],
    )
    marks: list[float] = []

    async def keeper(every_s: float) -> None:
        while clock.now() <= sc.progress_until_s:
            await store.mark_progress("s")
            marks.append(clock.now())
            await clock.sleep(every_s)

    keeper_task = None
    if sc.progress_every_s is not None:
        keeper_task = asyncio.ensure_future(keeper(sc.progress_every_s))
        await asyncio.sleep(0)  # the first mark lands at t = 0, before the call starts
    trail: tuple[AttemptRecord, ...]
    try:
        result: CallResult = await gw.call("s", "payload")
        verdict, trail = "success", result.attempts
    except AllSourcesExhausted as exc:
        verdict, trail = exc.reason, exc.trail
    except SourceFatalError as exc:
        verdict, trail = "fatal", exc.trail
    ended = clock.now()
    if keeper_task is not None:
        keeper_task.cancel()
    plan = gw.plan("s")
    snapshots = await gw.snapshot("s")
    return Run(
        scenario=sc,
        verdict=verdict,
        ended_s=ended,
        trail=trail,
        events=events,
        marks=marks,
        permits_in_use=sum(s.permits_in_use for s in snapshots),
        max_call_s=plan.max_call_s,
        window=plan.stall_window_s,
        exempt=plan.policy.rate_limit_exempt,
        timeouts=dict(plan.timeouts),
    )


# -- timeline reconstruction ---------------------------------------------------


def progress_stale(run: Run, t: float) -> bool:
    """Is the scope's progress age past the window at `t` (strictly, as the loop reads it)?"""
    before = [m for m in run.marks if m <= t]
    return not before or t - before[-1] > run.window


def stale_intervals(run: Run) -> list[tuple[float, float]]:
    """Open intervals of time during which the progress age exceeds the window."""
    if not run.marks:
        return [(-math.inf, math.inf)]
    marks = sorted(run.marks)
    spans = [(-math.inf, marks[0])]
    for this, nxt in itertools.pairwise([*marks, math.inf]):
        if this + run.window < nxt:
            spans.append((this + run.window, nxt))
    return spans


@dataclass(frozen=True)
class Step_:
    """A non-productive step: [start, end], with the productive time before it."""

    start: float
    end: float
    verdict_by: float  # the checkpoint that follows it
    productive_before: float
    checked: bool
    what: str = ""  # "no_runnable", "backoff" or "attempt" (a refunded one and its backoff)


def non_productive_steps(run: Run) -> list[Step_]:
    attempts = [e.record for e in run.events if isinstance(e, AttemptEvent)]
    waits = [e for e in run.events if isinstance(e, WaitEvent)]
    timeline = sorted(
        [(e.started_s, e.seconds, "attempt", e) for e in attempts]
        + [(e.started_s, e.seconds, e.cause, e) for e in waits],
        key=lambda item: (item[0], item[2] != "attempt"),
    )
    productive = 0.0
    out: list[Step_] = []
    charged = True  # whether the last attempt burned the retry budget
    for i, (start, seconds, what, event) in enumerate(timeline):
        end = start + seconds
        if what == "attempt":
            charged = event.burned_budget
        if what == "attempt" and event.productive:
            productive += seconds
            continue
        verdict_by = end
        nxt = timeline[i + 1] if i + 1 < len(timeline) else None
        # A refunded attempt: its backoff belongs to the same step.
        if what == "attempt" and nxt and nxt[2] == "backoff" and abs(nxt[0] - end) < 1e-9:
            verdict_by = nxt[0] + nxt[1]
        # Checkpoints: every step of an exempt call; the wait for a runnable source; the
        # backoff after a failure charged to waiting (SPEC §3 rule 15).
        checked = run.exempt or what == "no_runnable" or not charged
        out.append(Step_(start, end, verdict_by, productive, checked, what))
    return out


def first_due(run: Run) -> tuple[float, Step_] | None:
    """t*: the first instant both stall conditions hold inside a checked step and keep
    holding until the checkpoint that ends it (progress refreshed by another worker
    before the checkpoint means no verdict is due)."""
    stale = stale_intervals(run)
    for step in non_productive_steps(run):
        if not step.checked:
            continue
        lo = max(step.start, run.window + step.productive_before)
        for a, b in stale:
            if b <= step.verdict_by + 1e-6:
                continue  # fresh again by the checkpoint
            t = max(lo, a)
            if t < step.verdict_by - 1e-6:
                return t, step
    return None


def stalled_at(run: Run, t: float) -> float:
    records = [e.record for e in run.events if isinstance(e, AttemptEvent)]
    productive = sum(min(r.seconds, max(0.0, t - r.started_s)) for r in records if r.productive)
    return t - productive


def verdict_event(run: Run) -> VerdictEvent:
    (event,) = [e for e in run.events if isinstance(e, VerdictEvent)]
    return event
