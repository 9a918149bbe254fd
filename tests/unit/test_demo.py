"""The main job's demonstration accounts for every call, shows how a call to a provider
that queues ends, and shows the run in words and a timeline a newcomer can read."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from polygate_celery.cli import main
from polygate_celery.demo import run_demo
from polygate_celery.demo.display import (
    OUTAGE_LABEL,
    PLAIN_WIDTH,
    Display,
    Frame,
    ScopeState,
    plot_timeline,
    timeline_figure,
)
from polygate_celery.demo.pipeline import Tracker, closing_line, recovery_lines


async def test_demo_accounts_for_every_call() -> None:
    out = io.StringIO()
    missing = await run_demo(out, seconds=120)
    text = out.getvalue()
    assert missing == 0
    assert "540 of 540 calls accounted for." in text  # (2 + 2 + 0.5) per second
    assert "chat       stalled after 1 attempt(s), 301 s: no progress" in text
    assert "embedding  retry_exhausted after 3 attempt(s), 903 s: its retries used up" in text


async def test_the_offline_demo_says_what_it_compares_in_plain_words() -> None:
    out = io.StringIO()
    await run_demo(out, seconds=10)
    text = out.getvalue()
    assert "seed" not in text
    assert "gateway" not in text
    assert "One call to a provider that queues instead of refusing (it holds every request" in text
    assert "per source: its cap (calls at once it is allowed)" in text
    assert "its breaker (closed: calls go through; open: refused" in text


def test_cli_runs_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--offline", "--seconds", "20"]) == 0
    assert "calls accounted for" in capsys.readouterr().out


def test_cli_rejects_a_bad_argument_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--offline", "--seconds", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --seconds: '0': must be at least 1")
    assert err.count("\n") == 1


def test_a_plain_progress_line_fits_in_100_characters() -> None:
    scopes = [
        ScopeState("ocr", 200_000, 199_999, 1, 0, 0),
        ScopeState("embed", 200_000, 150_000, 0, 12_345, 99_999),
        ScopeState("summarise", 40_000, 0, 0, 40_000, 99_999),
    ]
    line = Frame(
        t=12_345.0, scopes=scopes, requests=10**6, served=8 * 10**5, limited=10**5, down=10**5
    ).plain()
    assert len(line) <= PLAIN_WIDTH
    assert line.startswith("t=12345s  ocr 200000/200000  embed 150000/200000 (12345 deferred)")


def test_the_closing_line_says_what_happened_not_what_was_hoped() -> None:
    quiet = Tracker(ids={"ocr": ["a"], "embed": ["b"], "summarise": ["c"]})
    quiet.states = {"a": "SUCCESS", "b": "SUCCESS", "c": "FAILURE"}
    assert closing_line(quiet) == (
        "3 of 3 tasks accounted for: 2 succeeded, 1 failed; none was deferred; none lost."
    )
    deferred = Tracker(ids={"ocr": [], "embed": [], "summarise": ["c", "d"]})
    deferred.states = {"c": "SUCCESS", "d": "DEFERRED"}
    deferred.ever_deferred = {"c", "d"}
    deferred.deferrals.update({"c": 2, "d": 1})
    assert closing_line(deferred) == (
        "1 of 2 tasks accounted for: 1 succeeded; 2 were deferred (3 deferrals in all), "
        "1 of them ran again and succeeded; 1 NOT accounted for."
    )


def test_recovery_lines_come_from_the_journal() -> None:
    def entry(at: float, model: str, status: int) -> SimpleNamespace:
        return SimpleNamespace(at=at, model=model, status=status)

    journal = [
        entry(10.0, "summariser", 503),
        entry(11.0, "summariser-small", 503),
        entry(31.5, "summariser", 200),
        entry(32.0, "summariser", 429),
    ]
    lines = recovery_lines(journal, (10.0, 28.0))
    assert lines[0] == (
        "The summarisers were down from t=10.0 s (the first summary request) to t=28.0 s: "
        "2 requests answered 503; the first summary after it was served at t=31.5 s, 3.5 s "
        "after the recovery (a deferred task comes back within deferral.max_delay_s = 8 s, "
        "plus jitter)."
    )
    assert lines[1].startswith("The summariser answered 429 once (its real quota is 30")
    assert recovery_lines([], None) == [
        "No summary was requested, so the summarisers never went down."
    ]


def test_the_timeline_is_drawn_as_a_png(tmp_path: Path) -> None:
    journal = [
        SimpleNamespace(at=t / 10, model="m", status=(200, 429, 503)[t % 3]) for t in range(90)
    ]
    path = tmp_path / "timeline.png"
    plot_timeline(path, journal, [(3.0, "summarise")], ["m"], ["summarise"], (2.0, 5.0))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_timeline_names_the_outage_and_its_legends_hide_no_data() -> None:
    journal = [
        SimpleNamespace(at=t / 10, model=m, status=(200, 429, 503)[t % 3])
        for t in range(300)
        for m in ("m", "n")
    ]
    figure = timeline_figure(journal, [(3.0, "summarise")], ["m", "n"], ["summarise"], (2.0, 5.0))
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure.canvas.draw()
    axes = figure.get_axes()
    assert len(axes) == 3  # a row per model, then the deferrals
    for axis in axes:
        legend = axis.get_legend()
        assert OUTAGE_LABEL in [text.get_text() for text in legend.get_texts()]
        assert legend.get_window_extent().x0 >= axis.get_window_extent().x1  # beside the plot
    assert figure.get_window_extent().x1 >= max(a.get_legend().get_window_extent().x1 for a in axes)
    plt.close(figure)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_provider_line_counts_answers_instead_of_an_empty_bar() -> None:
    out = Terminal()
    display = Display(out, [("ocr", 4), ("summarise", 2)])
    scopes = [ScopeState("ocr", 4, 4, 0, 0, 0), ScopeState("summarise", 2, 1, 0, 1, 3)]
    display.show(Frame(t=42, scopes=scopes, requests=20, served=12, limited=3, down=5), final=True)
    display.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "0/?" not in text
    assert "provider   t=42s  12 served (200), 3 rate limited (429), 5 down (503)" in text
    assert "4/4" in text  # the scopes keep their bars
