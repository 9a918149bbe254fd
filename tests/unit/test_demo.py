"""The main job's demonstration accounts for every call and shows the seed's verdicts."""

from __future__ import annotations

import io

import pytest

from polygate_celery.cli import main
from polygate_celery.demo import run_demo


async def test_demo_accounts_for_every_call() -> None:
    out = io.StringIO()
    missing = await run_demo(out, seconds=120)
    text = out.getvalue()
    assert missing == 0
    assert "540 of 540 calls accounted for." in text  # (2 + 2 + 0.5) per second
    assert "chat       stalled after 1 attempt(s), 301 s" in text
    assert "embedding  retry_exhausted after 3 attempt(s), 903 s" in text


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
