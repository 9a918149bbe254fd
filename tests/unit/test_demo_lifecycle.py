"""What the demo's lifecycle promises without starting anything: signals unwind like
Ctrl-C, the run's configuration file reads back as written, and the commands it prints
name the program as it was run."""

from __future__ import annotations

import contextlib
import signal
import sys
import tomllib
from pathlib import Path

import pytest

from polygate_celery.cli import main
from polygate_celery.demo import lifecycle
from polygate_celery.demo.lifecycle import Stopped, cli_command, stopped_by_signals, toml_text


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopping_signal_raises_where_the_demo_is_and_the_old_handler_comes_back(
    signum: signal.Signals,
) -> None:
    before = signal.getsignal(signum)
    with pytest.raises(Stopped) as stopped, stopped_by_signals():
        signal.raise_signal(signum)
    assert stopped.value.signum == signum
    assert stopped.value.exit_status == 128 + signum
    assert str(stopped.value) == signum.name
    assert signal.getsignal(signum) == before


def _stop_then_insist(cleaned: list[bool]) -> None:
    try:
        signal.raise_signal(signal.SIGTERM)
    finally:
        signal.raise_signal(signal.SIGHUP)  # the service manager insists while it cleans up
        cleaned.append(True)


def test_a_second_signal_while_it_cleans_up_is_ignored() -> None:
    cleaned: list[bool] = []
    with pytest.raises(Stopped) as stopped, stopped_by_signals():
        _stop_then_insist(cleaned)
    assert cleaned == [True]
    assert stopped.value.signum == signal.SIGTERM


def test_a_signal_whose_raise_was_lost_is_raised_again_where_the_demo_polls() -> None:
    with stopped_by_signals() as received:
        with contextlib.suppress(Stopped):  # as Python drops a raise inside a __del__
            signal.raise_signal(signal.SIGTERM)
        with pytest.raises(Stopped) as stopped:
            received.check()
    assert stopped.value.signum == signal.SIGTERM


def _press_ctrl_c_twice(cleaned: list[bool]) -> None:
    try:
        signal.raise_signal(signal.SIGINT)
    finally:
        signal.raise_signal(signal.SIGINT)  # pressed again while it cleans up
        cleaned.append(True)


def test_ctrl_c_raises_keyboard_interrupt_once_and_then_is_ignored_while_it_cleans_up() -> None:
    before = signal.getsignal(signal.SIGINT)
    cleaned: list[bool] = []
    with pytest.raises(KeyboardInterrupt), stopped_by_signals() as received:
        _press_ctrl_c_twice(cleaned)
    assert cleaned == [True]
    with pytest.raises(KeyboardInterrupt):
        received.check()
    assert signal.getsignal(signal.SIGINT) == before


def test_the_run_configuration_reads_back_as_written() -> None:
    config = {
        "store": {"redis_url": "redis://127.0.0.1:6400/0", "key_prefix": "demo-1a2b3c4d"},
        "deferral": {"strategy": "park", "max_delay_s": 8},
        "sources": {"summariser_small": {"base_url": "http://x/v1", "rpm": 60, "ratio": 0.5}},
        "scopes": {"summarise": {"sources": ["summariser", "summariser_small"], "on": True}},
        "quoted key": {'a "b"': "c\\\\d"},
    }
    assert tomllib.loads(toml_text(config)) == config


def test_the_printed_commands_name_the_program_as_it_was_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "argv", ["/somewhere/__main__.py", "demo"])
    assert cli_command() == f"{sys.executable} -m polygate_celery"
    script = tmp_path / "bin" / "polygate-celery"
    script.parent.mkdir()
    script.touch(mode=0o755)
    monkeypatch.setattr(sys, "argv", [str(script), "demo"])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cli_command() == str(script)  # not on PATH: as typed
    monkeypatch.setenv("PATH", str(script.parent))
    assert cli_command() == "polygate-celery"
    assert lifecycle.status_command(Path("/tmp/a b/polygate.toml")) == (
        "polygate-celery status --config '/tmp/a b/polygate.toml'"
    )


def test_plot_without_matplotlib_is_one_line_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import importlib.util  # noqa: PLC0415

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    monkeypatch.setattr("polygate_celery.demo.pipeline.run", lambda **_: pytest.fail("ran"))
    assert main(["demo", "--plot", str(tmp_path / "t.png")]) == 2
    assert (
        capsys.readouterr().err == "error: --plot draws with matplotlib: pip install matplotlib\n"
    )
