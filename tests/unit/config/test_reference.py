"""The manual's configuration reference is the one generated from the models."""

from __future__ import annotations

from pathlib import Path

from polygate_celery.config.reference import PAGE_PATH, main, page

ROOT = Path(__file__).resolve().parents[3]


def test_the_manual_carries_the_current_reference() -> None:
    text = (ROOT / PAGE_PATH).read_text(encoding="utf-8")
    assert text == page(), (
        f"{PAGE_PATH} is out of date: run `python -m polygate_celery.config.reference --write`"
    )


def test_every_table_is_on_the_page_under_its_section() -> None:
    text = page()
    for heading in ("## Store", "## Deferral", "## Sources", "## Quotas", "## Scopes"):
        assert f"\n{heading}\n" in text
    assert "### `[sources.NAME.breaker]`" in text
    assert "| `include_bodies` | false |" in text


def test_write_regenerates_the_page(tmp_path: Path) -> None:
    (tmp_path / PAGE_PATH).parent.mkdir(parents=True)
    assert main(["--write", str(tmp_path)]) == 0
    assert (tmp_path / PAGE_PATH).read_text(encoding="utf-8") == page()
