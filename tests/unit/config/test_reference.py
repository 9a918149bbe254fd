"""The README's configuration reference is the one generated from the models."""

from __future__ import annotations

from pathlib import Path

from polygate_celery.config.reference import reference

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_carries_the_current_reference() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("<!-- config-reference:start -->\n") + len(
        "<!-- config-reference:start -->\n"
    )
    end = text.index("<!-- config-reference:end -->")
    assert text[start:end] == reference(), (
        "README.md is out of date: paste `python -m polygate_celery.config.reference` "
        "between the config-reference markers"
    )
