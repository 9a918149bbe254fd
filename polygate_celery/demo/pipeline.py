"""Edge: `polygate-celery demo`, the example pipeline end to end on a private setup.

It starts what the pipeline needs, unless told otherwise: a Redis (the one at
``$POLYGATE_REDIS_URL``, else an embedded server on a free port), a simulated
OpenAI-compatible provider whose summariser has a 60-RPM quota and goes down
for a while in the middle, and a Celery worker process running the example's
``tasks.py`` (`polygate_celery.demo.example`, ``examples/pipeline`` in the
repository; shipped with the package, so a pip install runs it too). It sends a
few hundred tasks (OCR every page, embed it, summarise each document), shows their
progress live, ends with a summary in which every task is accounted for, and stops
everything it started, also on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from polygate_celery.embedded import EmbeddedRedis, answers

SCOPES = ("ocr", "embed", "summarise")
SOURCES = {"vision": "vision-ocr", "embedder": "embedder", "summariser": "summariser",
           "summariser_small": "summariser-small"}  # fmt: skip
OUTAGE = (8.0, 26.0)  # both summarisers are down for this window (s after the provider starts)
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

    def name(self, step: str, page: int) -> str:
        task_id = f"{step}-{uuid.uuid4().hex[:12]}"
        self.ids["summarise" if step == "summarise" else step].append(task_id)
        return task_id

    @property
    def total(self) -> int:
        return sum(len(ids) for ids in self.ids.values())

    def poll(self, app: Any) -> None:
        for ids in self.ids.values():
            for task_id in ids:
                if self.states.get(task_id) in TERMINAL:
                    continue
                result = app.AsyncResult(task_id)
                state = result.state
                self.states[task_id] = state
                if state == "DEFERRED" and isinstance(result.info, dict):
                    self.ever_deferred.add(task_id)
                    seen = int(result.info.get("deferrals", 0))
                    self.deferrals[task_id] = max(self.deferrals[task_id], seen)

    def counts(self, scope: str) -> Counter[str]:
        states = Counter(self.states.get(i, "PENDING") for i in self.ids[scope])
        return Counter(
            succeeded=states["SUCCESS"],
            deferred=states["DEFERRED"],
            failed=states["FAILURE"] + states["REVOKED"],
            waiting=len(self.ids[scope]) - states["SUCCESS"] - states["DEFERRED"]
            - states["FAILURE"] - states["REVOKED"],
        )  # fmt: skip

    @property
    def done(self) -> bool:
        return all(self.states.get(i) in TERMINAL for ids in self.ids.values() for i in ids)


@contextlib.contextmanager
def worker_process(env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "celery", "-A", TASKS, "worker",
               "--pool", "threads", "--concurrency", "24", "--loglevel", "ERROR",
               "--without-heartbeat", "--without-mingle", "--without-gossip"]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


def page_images(document: int, pages: int) -> list[bytes]:
    return [bytes([document % 251]) * (3000 + 997 * page) for page in range(pages)]


def run(
    *,
    documents: int = 40,
    pages: int = 5,
    redis_url: str | None = None,
    out: TextIO = sys.stdout,
    timeout_s: float = 300.0,
    outage: tuple[float, float] = OUTAGE,
) -> int:
    """Run the demo; 0 when every task is accounted for, 1 otherwise. Raises `DemoError`."""
    from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider  # noqa: PLC0415

    started = time.monotonic()
    url = redis_url or os.environ.get("POLYGATE_REDIS_URL")
    with contextlib.ExitStack() as stack:
        if url:
            if not answers(url, 2.0):
                raise DemoError(f"cannot reach Redis at {_where(url)}")
            where = _where(url)
        else:
            url = stack.enter_context(EmbeddedRedis()).url
            where = f"an embedded server on port {_where(url).rsplit(':', 1)[-1]}"
        models = json.loads((EXAMPLE / "models.json").read_text())
        for model in ("summariser", "summariser-small"):
            models[model]["outages"] = [list(outage)]
        models["summariser"]["rpm"] = 50  # a little below the 60 configured: some 429s
        provider = stack.enter_context(
            SimulatedProvider({k: ModelBehaviour.from_dict(v) for k, v in models.items()})
        )
        env = _worker_env(url, provider.url)
        worker = stack.enter_context(worker_process({**os.environ, **env}))
        print(f"polygate_celery demo: Redis at {where}; simulated provider at {provider.url};"
              f" a worker (threads pool, 24).", file=out)  # fmt: skip
        print(f"The summariser is configured for 60 requests a minute but allows 50; it and "
              f"its small fallback (2 at a time) are down from {outage[0]:.0f} s to "
              f"{outage[1]:.0f} s, longer than the 6 s stall window.\n", file=out)  # fmt: skip
        app, tracker = _send(env, documents, pages)
        print(f"Sent {documents} documents of {pages} pages: {tracker.total} tasks.\n", file=out)
        _watch(app, tracker, provider, worker, out, started, timeout_s)
        _summary(tracker, provider, out, time.monotonic() - started)
        accounted = sum(tracker.counts(s)["succeeded"] + tracker.counts(s)["failed"]
                        for s in SCOPES)  # fmt: skip
        return 0 if accounted == tracker.total else 1


def _where(url: str) -> str:
    tail = url.split("://", 1)[-1].rsplit("@", 1)[-1]
    return tail.split("/", 1)[0]


def _worker_env(redis_url: str, provider_url: str) -> dict[str, str]:
    env = {
        "POLYGATE_CONFIG": str(EXAMPLE / "polygate.toml"),
        "POLYGATE_STORE__REDIS_URL": redis_url,
        "POLYGATE_STORE__KEY_PREFIX": f"demo-{uuid.uuid4().hex[:8]}",
        "POLYGATE_SCOPES__SUMMARISE__STALL_WINDOW_S": "6",
        "POLYGATE_DEFERRAL__MAX_DELAY_S": "8",
    }
    for source in SOURCES:
        env[f"POLYGATE_SOURCES__{source.upper()}__BASE_URL"] = provider_url
    return env


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
    live = out.isatty()
    drawn = 0
    last_line = 0.0
    while True:
        tracker.poll(app)
        lines = _progress(tracker, provider, time.monotonic() - started)
        if live:
            if drawn:
                out.write(f"\x1b[{drawn}F")
            out.write("\n".join(f"{line}\x1b[K" for line in lines) + "\n")
            drawn = len(lines)
        elif time.monotonic() - last_line >= 5 or tracker.done:
            out.write(lines[0] + " | " + " | ".join(lines[2:5]) + "\n")
            last_line = time.monotonic()
        out.flush()
        if tracker.done:
            return
        if worker.poll() is not None:
            raise DemoError(f"the worker stopped (exit {worker.returncode})")
        if time.monotonic() - started > timeout_s:
            raise DemoError(f"the demo did not finish within {timeout_s:.0f} s")
        time.sleep(0.5)


def _progress(tracker: Tracker, provider: Any, elapsed: float) -> list[str]:
    journal = provider.journal
    limited = sum(1 for entry in journal if entry.status == 429)
    down = sum(1 for entry in journal if entry.status == 503)
    flight = "  ".join(f"{s} {provider.in_flight(m)}" for s, m in SOURCES.items())
    lines = [f"t={elapsed:5.1f}s  provider: {len(journal)} requests, {limited} answered 429, "
             f"{down} answered 503", f"in flight: {flight}"]  # fmt: skip
    for scope in SCOPES:
        c = tracker.counts(scope)
        lines.append(
            f"{scope:10s} succeeded {c['succeeded']:4d}  deferred now {c['deferred']:3d}  "
            f"failed {c['failed']:3d}  waiting {c['waiting']:4d}"
        )
    return lines


def _summary(tracker: Tracker, provider: Any, out: TextIO, elapsed: float) -> None:
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
    print("\n" + closing_line(tracker), file=out)
    print(f"Next: README.md (how it works, deployment); the code you just ran: {EXAMPLE}"
          " (examples/pipeline in the repository); polygate-celery status (a live view of the"
          " governance state).", file=out)  # fmt: skip


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
