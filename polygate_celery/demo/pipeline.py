"""Edge: `polygate-celery demo`, the example pipeline end to end on a private setup.

It starts what the pipeline needs, unless told otherwise: a Redis (the one at
``$POLYGATE_REDIS_URL``, else an embedded server on a free port), a simulated
OpenAI-compatible provider whose summariser has a 60-RPM quota and goes down
for a while in the middle, and a Celery worker process running the example's
``tasks.py`` (`polygate_celery.demo.example`, ``examples/pipeline`` in the
repository; shipped with the package, so a pip install runs it too). It sends a
few hundred tasks (OCR every page, embed it, summarise each document), shows their
progress live, ends with a summary in which every task is accounted for (`report`),
and stops everything it started, also on Ctrl-C, SIGTERM and SIGHUP (`lifecycle`). With
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
from pathlib import Path
from typing import Any, TextIO

from polygate_celery.demo.display import Display, Frame, plot_timeline
from polygate_celery.demo.lifecycle import (
    Received,
    cli_command,
    status_command,
    stopped_by_signals,
    toml_text,
    worker_process,
)
from polygate_celery.demo.report import (
    MAX_DELAY_S,
    PROVIDER_RPM,
    SCOPES,
    SOURCES,
    SUMMARISERS,
    TERMINAL,
    Report,
    Tracker,
    _outage_at,
    _report,
    _summary,
    closing_line,
    recovery_lines,
)
from polygate_celery.embedded import EmbeddedRedis, answers

__all__ = [
    "MAX_DELAY_S",
    "OUTAGE",
    "PROVIDER_RPM",
    "SCOPES",
    "SOURCES",
    "SUMMARISERS",
    "TERMINAL",
    "DemoError",
    "Report",
    "Tracker",
    "closing_line",
    "recovery_lines",
    "run",
    "run_pipeline",
]

# Both summarisers are down for this window, in seconds after the summariser's first request:
# whatever the machine's speed, the outage meets the summaries (3x the 6 s stall window).
OUTAGE = (0.0, 18.0)


class DemoError(Exception):
    """A problem the user can fix; reported in one line."""


EXAMPLE = Path(__file__).resolve().parent / "example"
TASKS = "polygate_celery.demo.example.tasks"


WORKER = ("-m", "celery", "-A", TASKS, "worker", "--pool", "threads", "--concurrency", "24",
          "--loglevel", "ERROR", "--without-heartbeat", "--without-mingle",
          "--without-gossip")  # fmt: skip


def page_images(document: int, pages: int) -> list[bytes]:
    return [bytes([document % 251]) * (3000 + 997 * page) for page in range(pages)]


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
    with stopped_by_signals() as received:
        return _run(documents, pages, redis_url, out, timeout_s, outage, plot, keep, received)


def _run(
    documents: int,
    pages: int,
    redis_url: str | None,
    out: TextIO,
    timeout_s: float,
    outage: tuple[float, float],
    plot: Path | None,
    keep: bool,
    received: Received,
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
        _watch(app, tracker, provider, worker, out, started, timeout_s, received)
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
    received: Received,
) -> None:
    display = Display(out, [(scope, len(tracker.ids[scope])) for scope in SCOPES])
    try:
        while True:
            received.check()  # a signal whose raise was lost
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
