"""Edge (demo): what the pipeline demo shows while it runs, and the timeline it can draw.

On a terminal, a live progress bar per scope and a line counting the provider's
answers (`rich`); otherwise one short plain line (at most `PLAIN_WIDTH` characters)
every few seconds. `plot_timeline` draws requests, 429s and 503s per second per
model, and deferrals per second per scope, as a PNG (`matplotlib`). ``rich`` comes
with the ``demo`` extra; ``matplotlib``, used by ``--plot`` alone, is installed on
its own (or with the ``bench`` extra).
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
    served: int  # answered 200
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


def provider_line(frame: Frame | None) -> str:
    """The provider's line under the bars: its answers so far, counted by kind."""
    if frame is None:
        return f"{'provider':<10} no request yet"
    return (
        f"{'provider':<10} t={frame.t:.0f}s  {frame.served} served (200), "
        f"{frame.limited} rate limited (429), {frame.down} down (503)"
    )


class Display:
    """Shows frames: bars on a terminal (with `rich`), else a plain line every few seconds."""

    def __init__(self, out: TextIO, scopes: Iterable[tuple[str, int]]) -> None:
        self.out = out
        self._last_plain: float | None = None
        self._live: Any = None
        self._bars: Any = None
        self._provider: Any = None
        self._tasks: dict[str, Any] = {}
        if out.isatty():
            self._start_bars(list(scopes))

    def _start_bars(self, scopes: list[tuple[str, int]]) -> None:
        try:
            from rich.console import Console, Group  # noqa: PLC0415
            from rich.live import Live  # noqa: PLC0415
            from rich.progress import (  # noqa: PLC0415
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
            )
            from rich.text import Text  # noqa: PLC0415
        except ImportError:  # the plain lines will do
            return
        self._bars = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
        )
        for name, total in scopes:
            self._tasks[name] = self._bars.add_task(name, total=total, note="")
        # The provider has no total to fill a bar towards: its line is counts, as text.
        self._provider = Text(provider_line(None))
        self._live = Live(
            Group(self._bars, self._provider),
            console=Console(file=self.out),
            refresh_per_second=4,
            transient=False,
        )
        self._live.start()

    def show(self, frame: Frame, final: bool = False) -> None:
        if self._live is not None:
            for s in frame.scopes:
                note = f"deferred now {s.deferred_now}, deferrals {s.deferrals}"
                note += f", failed {s.failed}" if s.failed else ""
                self._bars.update(self._tasks[s.name], completed=s.finished, note=note)
            self._provider.plain = provider_line(frame)
            if final:
                self._live.refresh()
            return
        if final or self._last_plain is None or frame.t - self._last_plain >= PLAIN_EVERY_S:
            self.out.write(frame.plain() + "\n")
            self.out.flush()
            self._last_plain = frame.t

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


STATUSES = ((200, "200 served", "tab:blue"), (429, "429 rate limited", "tab:orange"),
            (503, "503 down", "tab:red"))  # fmt: skip


def per_second(times: Iterable[float], seconds: int) -> list[int]:
    counts = Counter(int(t) for t in times if t >= 0)
    return [counts.get(second, 0) for second in range(seconds)]


OUTAGE_LABEL = "outage (the summarisers down)"


def plot_timeline(
    path: Path,
    requests: Sequence[Request],
    deferrals: Sequence[tuple[float, str]],
    models: Sequence[str],
    scopes: Sequence[str],
    outage: tuple[float, float] | None,
) -> None:
    """Draw the run (`timeline_figure`) as a PNG at `path`."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure = timeline_figure(requests, deferrals, models, scopes, outage)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def timeline_figure(
    requests: Sequence[Request],
    deferrals: Sequence[tuple[float, str]],
    models: Sequence[str],
    scopes: Sequence[str],
    outage: tuple[float, float] | None,
) -> Any:
    """The run, per second: each model's requests (200, 429, 503) and each scope's
    deferrals; the outage shaded and named in each legend; the legends right of the
    plots, where they hide no data."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # no screen needed
    import matplotlib.pyplot as plt  # noqa: PLC0415

    end = max([r.at for r in requests] + [t for t, _ in deferrals] + [1.0])
    seconds = int(end) + 2
    xs = list(range(seconds))
    shown = [m for m in models if any(r.model == m for r in requests)]
    figure, axes = plt.subplots(
        len(shown) + 1,
        1,
        figsize=(11, 2.0 * (len(shown) + 1)),
        sharex=True,
        squeeze=False,
        layout="constrained",  # makes room for the legends outside the plots
    )
    for axis, model in zip((a[0] for a in axes[:-1]), shown, strict=True):
        mine = [r for r in requests if r.model == model]
        for status, label, color in STATUSES:
            counts = per_second((r.at for r in mine if r.status == status), seconds)
            if any(counts):
                axis.step(xs, counts, where="post", label=label, color=color)
        axis.set_ylabel(f"{model}\nrequests/s")
    deferred_axis = axes[-1][0]
    for scope in scopes:
        counts = per_second((t for t, s in deferrals if s == scope), seconds)
        if any(counts):
            deferred_axis.step(xs, counts, where="post", label=f"{scope} deferred")
    deferred_axis.set_ylabel("deferrals/s")
    deferred_axis.set_xlabel("seconds since the provider started")
    for row in axes:
        axis = row[0]
        if outage is not None:
            axis.axvspan(*outage, color="grey", alpha=0.2, lw=0, label=OUTAGE_LABEL)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                        borderaxespad=0.0)  # fmt: skip
    figure.suptitle("polygate_celery demo: the provider's answers and the deferrals")
    return figure
