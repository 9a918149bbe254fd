"""Edge: `polygate-celery demo`, the example pipeline end to end on a private setup.

It starts what the pipeline needs, unless told otherwise: a Redis (the one at
``$POLYGATE_REDIS_URL``, else an embedded server on a free port), a simulated
OpenAI-compatible provider whose summariser has a 60-RPM quota and goes down
for a while in the middle, and a Celery worker process running the example's
``tasks.py`` (`polygate_celery.demo.example`, ``examples/pipeline`` in the
repository; shipped with the package, so a pip install runs it too). It sends a
few hundred tasks (OCR every page, embed it, summarise each document), shows their
progress live, ends with a summary in which every task is accounted for, and stops
everything it started, also on Ctrl-C, SIGTERM and SIGHUP (`lifecycle`). With
``keep`` it leaves its Redis and its configuration up after the run, for
``polygate-celery status``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from polygate_celery.demo.display import Display, Frame, ScopeState, plot_timeline
from polygate_celery.demo.lifecycle import (
    cli_command,
    status_command,
    stopped_by_signals,
    toml_text,
    worker_process,
)
from polygate_celery.embedded import EmbeddedRedis, answers

SCOPES = ("ocr", "embed", "summarise")
SOURCES = {"vision": "vision-ocr", "embedder": "embedder", "summariser": "summariser",
           "summariser_small": "summariser-small"}  # fmt: skip
# Both summarisers are down for this window, in seconds after the summariser's first request:
# whatever the machine's speed, the outage meets the summaries (3x the 6 s stall window).
OUTAGE = (0.0, 18.0)
PROVIDER_RPM = 30  # the summariser's real quota; the configuration says 60: 429s to handle
MAX_DELAY_S = 8  # the demo's deferral.max_delay_s: a deferred task is back within this
TERMINAL = {"SUCCESS", "FAILURE", "REVOKED"}


class DemoError(Exception):
    """A problem the user can fix; reported in one line."""


EXAMPLE = Path(__file__).resolve().parent / "example"
TASKS = "polygate_celery.demo.example.tasks"


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


WORKER = ("-m", "celery", "-A", TASKS, "worker", "--pool", "threads", "--concurrency", "24",
          "--loglevel", "ERROR", "--without-heartbeat", "--without-mingle",
          "--without-gossip")  # fmt: skip


def page_images(document: int, pages: int) -> list[bytes]:
    return [bytes([document % 251]) * (3000 + 997 * page) for page in range(pages)]


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


def run(**options: Any) -> int:
    """Run the demo (`run_pipeline`'s options); 0 when every task is accounted for, else 1."""
    return 0 if run_pipeline(**options).lost == 0 else 1


def run_pipeline(
    *,
    documents: int = 40,
    pages: int = 5,
    redis_url: str | None = None,
    out: TextIO = sys.stdout,
    timeout_s: float = 300.0,
    outage: tuple[float, float] = OUTAGE,
    plot: Path | None = None,
    keep: bool = False,
) -> Report:
    """Run the demo and say what it did. Raises `DemoError`, and `Stopped` on SIGTERM or
    SIGHUP once everything it started is stopped.

    `outage` is in seconds after the summariser's first request; `plot`, a PNG to draw
    the run's timeline to; `keep`, leave the Redis and the run's configuration up after
    a finished run, and say how to look at them and how to stop them."""
    with stopped_by_signals():
        return _run(documents, pages, redis_url, out, timeout_s, outage, plot, keep)


def _run(
    documents: int,
    pages: int,
    redis_url: str | None,
    out: TextIO,
    timeout_s: float,
    outage: tuple[float, float],
    plot: Path | None,
    keep: bool,
) -> Report:
    from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider  # noqa: PLC0415

    started = time.monotonic()
    url = redis_url or os.environ.get("POLYGATE_REDIS_URL")
    run_dir = Path(tempfile.mkdtemp(prefix="polygate-demo-"))
    server: EmbeddedRedis | None = None
    kept = False

    def clean_up() -> None:
        if not kept:
            if server is not None:
                server.close()
            shutil.rmtree(run_dir, ignore_errors=True)

    with contextlib.ExitStack() as stack:
        stack.callback(clean_up)
        if url:
            if not answers(url, 2.0):
                raise DemoError(f"cannot reach Redis at {_where(url)}")
            where = _where(url)
        else:
            server = EmbeddedRedis(directory=run_dir / "redis")
            url = server.start().url
            where = f"an embedded server on port {server.port}"
        models = json.loads((EXAMPLE / "models.json").read_text())
        for model in ("summariser", "summariser-small"):
            models[model]["outages"] = [list(outage)]
            models[model]["outages_from"] = "summariser"
        models["summariser"]["rpm"] = PROVIDER_RPM
        provider = stack.enter_context(
            SimulatedProvider({k: ModelBehaviour.from_dict(v) for k, v in models.items()})
        )
        config = run_dir / "polygate.toml"
        env = _worker_env(url, provider.url, config)
        worker = stack.enter_context(
            worker_process([sys.executable, *WORKER], {**os.environ, **env})
        )
        print(f"polygate_celery demo: Redis at {where}; simulated provider at {provider.url};"
              f" a worker (threads pool, 24).", file=out)  # fmt: skip
        print(f"The summariser is configured for 60 requests a minute but allows "
              f"{PROVIDER_RPM}; it and its small fallback (2 at a time) go down for "
              f"{outage[1] - outage[0]:.0f} s from the first summary request, longer than the "
              f"6 s stall window.", file=out)  # fmt: skip
        print(f"To watch the governance state from another terminal while it runs:\n"
              f"  {status_command(config)} --watch\n", file=out)  # fmt: skip
        app, tracker = _send(env, documents, pages)
        print(f"Sent {documents} documents of {pages} pages: {tracker.total} tasks.\n", file=out)
        _watch(app, tracker, provider, worker, out, started, timeout_s)
        _summary(tracker, provider, out, time.monotonic() - started, outage)
        if plot is not None:
            plot_timeline(
                plot,
                provider.journal,
                tracker.deferral_times,
                list(SOURCES.values()),
                SCOPES,
                _outage_at(provider, outage),
            )
            print(f"Timeline: {plot}", file=out)
        kept = keep
        print(_next_steps(config, server if kept else None, run_dir if kept else None), file=out)
        return _report(tracker, provider.journal, _outage_at(provider, outage), started)


def _next_steps(config: Path, server: EmbeddedRedis | None, kept: Path | None) -> str:
    """Where to read on; with `--keep`, what was kept, how to look at it and how to stop it."""
    line = (f"Next: README.md (how it works, deployment); the code you just ran: {EXAMPLE}"
            " (examples/pipeline in the repository).")  # fmt: skip
    if kept is None:
        return line + (f" To look at its Redis after a run: {cli_command()} demo --keep "
                       "(it prints how).")  # fmt: skip
    if server is not None:
        what = f"its Redis (pid {server.pid}) and its configuration ({config})"
        stop = f"kill {server.pid}; rm -r {shlex.quote(str(kept))}"
    else:
        what = f"its configuration ({config}); its keys stay in that Redis"
        stop = f"rm -r {shlex.quote(str(kept))}"
    return (f"{line}\nKept {what}. The worker and the simulated provider are stopped.\n"
            f"  look: {status_command(config)}\n  stop: {stop}")  # fmt: skip


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


SUMMARISERS = ("summariser", "summariser-small")


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


def _where(url: str) -> str:
    tail = url.split("://", 1)[-1].rsplit("@", 1)[-1]
    return tail.split("/", 1)[0]


def _worker_env(redis_url: str, provider_url: str, config: Path) -> dict[str, str]:
    """The worker's settings, also written to `config` for `polygate-celery status`.

    The variables win over any ``POLYGATE_*`` the user's shell holds, so the worker
    runs what the demo describes."""
    env = {
        "POLYGATE_STORE__REDIS_URL": redis_url,
        "POLYGATE_STORE__KEY_PREFIX": f"demo-{uuid.uuid4().hex[:8]}",
        "POLYGATE_SCOPES__SUMMARISE__STALL_WINDOW_S": "6",
        "POLYGATE_DEFERRAL__MAX_DELAY_S": str(MAX_DELAY_S),
    }
    for source in SOURCES:
        env[f"POLYGATE_SOURCES__{source.upper()}__BASE_URL"] = provider_url
    settings = tomllib.loads((EXAMPLE / "polygate.toml").read_text())
    for name, value in env.items():
        *path, last = name.removeprefix("POLYGATE_").lower().split("__")
        table = settings
        for part in path:
            table = table.setdefault(part, {})
        table[last] = int(value) if value.isdigit() else value
    config.write_text(toml_text(settings))
    return {"POLYGATE_CONFIG": str(config), **env}


def _send(env: dict[str, str], documents: int, pages: int) -> tuple[Any, Tracker]:
    tasks = _import_tasks(env)
    tracker = Tracker()
    for document in range(documents):
        canvas = tasks.process(f"doc-{document}", page_images(document, pages), tracker.name)
        canvas.apply_async()
    return tasks.app, tracker


def _import_tasks(env: dict[str, str]) -> Any:
    """The example's tasks module, configured by `env` as the worker's is.

    The module reads its configuration when imported, so it is imported afresh
    under `env`, which is then taken back out of this process's environment.
    """
    saved = {name: os.environ.get(name) for name in env}
    sys.modules.pop(TASKS, None)
    os.environ.update(env)
    try:
        return importlib.import_module(TASKS)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _watch(
    app: Any,
    tracker: Tracker,
    provider: Any,
    worker: subprocess.Popen[bytes],
    out: TextIO,
    started: float,
    timeout_s: float,
) -> None:
    display = Display(out, [(scope, len(tracker.ids[scope])) for scope in SCOPES])
    try:
        while True:
            now = provider.since_start()
            tracker.poll(app, now)
            display.show(_frame(tracker, provider, now), final=tracker.done)
            if tracker.done:
                return
            if worker.poll() is not None:
                raise DemoError(f"the worker stopped (exit {worker.returncode})")
            if time.monotonic() - started > timeout_s:
                raise DemoError(f"the demo did not finish within {timeout_s:.0f} s")
            time.sleep(0.5)
    finally:
        display.close()


def _frame(tracker: Tracker, provider: Any, now: float) -> Frame:
    journal = provider.journal
    return Frame(
        t=now,
        scopes=[tracker.scope_state(scope) for scope in SCOPES],
        requests=len(journal),
        served=sum(1 for entry in journal if entry.status == 200),
        limited=sum(1 for entry in journal if entry.status == 429),
        down=sum(1 for entry in journal if entry.status == 503),
    )


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
