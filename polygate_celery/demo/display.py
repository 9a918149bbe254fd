"""Edge (demo): what the pipeline demo shows while it runs, and the timeline it can draw.

On a terminal, a live progress bar per scope (`rich`); otherwise one short plain line
(at most `PLAIN_WIDTH` characters) every few seconds. `plot_timeline` draws requests,
429s and 503s per second per model, and deferrals per second per scope, as a PNG
(`matplotlib`). Both libraries come with the ``demo`` extra.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

PLAIN_WIDTH = 100
PLAIN_EVERY_S = 5.0


class Request(Protocol):
    """A journal entry of the simulated provider, as far as the display reads it."""

    @property
    def at(self) -> float: ...
    @property
    def model(self) -> str: ...
    @property
    def status(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ScopeState:
    name: str
    total: int
    succeeded: int
    failed: int
    deferred_now: int
    deferrals: int  # deferrals so far, every task of the scope

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed


@dataclass(frozen=True, slots=True)
class Frame:
    """One look at the run: the provider's time, the scopes, the provider's answers."""

    t: float
    scopes: Sequence[ScopeState]
    requests: int
    limited: int  # answered 429
    down: int  # answered 503

    def plain(self) -> str:
        """One line of at most `PLAIN_WIDTH` characters."""
        cells = []
        for s in self.scopes:
            deferred = f" ({s.deferred_now} deferred)" if s.deferred_now else ""
            cells.append(f"{s.name} {s.finished}/{s.total}{deferred}")
        line = f"t={self.t:4.0f}s  " + "  ".join(cells)
        tail = f"  | 429: {self.limited} 503: {self.down}"
        if len(line) + len(tail) <= PLAIN_WIDTH:
            line += tail
        return line[:PLAIN_WIDTH]


class Display:
    """Shows frames: bars on a terminal (with `rich`), else a plain line every few seconds."""

    def __init__(self, out: TextIO, scopes: Iterable[tuple[str, int]]) -> None:
        self.out = out
        self._last_plain: float | None = None
        self._live: Any = None
        self._tasks: dict[str, Any] = {}
        if out.isatty():
            self._start_bars(list(scopes))

    def _start_bars(self, scopes: list[tuple[str, int]]) -> None:
        try:
            from rich.console import Console  # noqa: PLC0415
            from rich.progress import (  # noqa: PLC0415
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
            )
        except ImportError:  # the plain lines will do
            return
        self._live = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            console=Console(file=self.out),
            transient=False,
        )
        for name, total in scopes:
            self._tasks[name] = self._live.add_task(name, total=total, note="")
        self._tasks["provider"] = self._live.add_task("provider", total=None, note="")
        self._live.start()

    def show(self, frame: Frame, final: bool = False) -> None:
        if self._live is not None:
            for s in frame.scopes:
                note = f"deferred now {s.deferred_now}, deferrals {s.deferrals}"
                note += f", failed {s.failed}" if s.failed else ""
                self._live.update(self._tasks[s.name], completed=s.finished, note=note)
            note = f"t={frame.t:.0f}s  {frame.requests} requests, 429: {frame.limited}, "
            note += f"503: {frame.down}"
            self._live.update(self._tasks["provider"], note=note)
            return
        if final or self._last_plain is None or frame.t - self._last_plain >= PLAIN_EVERY_S:
            self.out.write(frame.plain() + "\n")
            self.out.flush()
            self._last_plain = frame.t

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


STATUSES = ((200, "200", "tab:blue"), (429, "429 rate limited", "tab:orange"),
            (503, "503 down", "tab:red"))  # fmt: skip


def per_second(times: Iterable[float], seconds: int) -> list[int]:
    counts = Counter(int(t) for t in times if t >= 0)
    return [counts.get(second, 0) for second in range(seconds)]


def plot_timeline(
    path: Path,
    requests: Sequence[Request],
    deferrals: Sequence[tuple[float, str]],
    models: Sequence[str],
    scopes: Sequence[str],
    outage: tuple[float, float] | None,
) -> None:
    """Draw the run, per second: each model's requests (200, 429, 503) and each scope's
    deferrals, the outage shaded; write a PNG to `path`."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # no screen needed
    import matplotlib.pyplot as plt  # noqa: PLC0415

    end = max([r.at for r in requests] + [t for t, _ in deferrals] + [1.0])
    seconds = int(end) + 2
    xs = list(range(seconds))
    shown = [m for m in models if any(r.model == m for r in requests)]
    figure, axes = plt.subplots(
        len(shown) + 1, 1, figsize=(10, 2.0 * (len(shown) + 1)), sharex=True, squeeze=False
    )
    for axis, model in zip((a[0] for a in axes[:-1]), shown, strict=True):
        mine = [r for r in requests if r.model == model]
        for status, label, color in STATUSES:
            counts = per_second((r.at for r in mine if r.status == status), seconds)
            if any(counts):
                axis.step(xs, counts, where="post", label=label, color=color)
        axis.set_ylabel(f"{model}\nrequests/s")
        axis.legend(loc="upper right", fontsize="small")
    deferred_axis = axes[-1][0]
    for scope in scopes:
        counts = per_second((t for t, s in deferrals if s == scope), seconds)
        if any(counts):
            deferred_axis.step(xs, counts, where="post", label=scope)
    deferred_axis.set_ylabel("deferrals/s")
    deferred_axis.set_xlabel("seconds since the provider started")
    if deferred_axis.get_legend_handles_labels()[0]:
        deferred_axis.legend(loc="upper right", fontsize="small")
    if outage is not None:
        for row in axes:
            row[0].axvspan(*outage, color="grey", alpha=0.15, lw=0)
    figure.suptitle("polygate_celery demo: the provider's answers and the deferrals")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
