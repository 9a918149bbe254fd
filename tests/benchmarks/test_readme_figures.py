"""The README and the manual quote only figures the committed results files hold (as the
configuration reference is checked against the models)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import readme_figures


@pytest.mark.parametrize(
    "page",
    readme_figures.pages(),
    ids=[str(page.relative_to(readme_figures.ROOT)) for page in readme_figures.pages()],
)
def test_every_figure_block_of_a_page_is_what_the_results_say(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert readme_figures.render(text, str(page)) == text, (
        f"{page.name}'s figures differ from benchmarks/: run `python benchmarks/readme_figures.py "
        "--write`"
    )


def test_every_figure_block_is_on_a_page() -> None:
    texts = [page.read_text(encoding="utf-8") for page in readme_figures.pages()]
    assert readme_figures.unplaced(texts) == []


def test_a_block_no_results_file_renders_is_refused() -> None:
    with pytest.raises(SystemExit, match="invented"):
        readme_figures.render("<!-- figures:invented -->\n1 000 %\n<!-- /figures:invented -->\n")


def test_a_stale_figure_is_rendered_anew_and_an_empty_block_filled() -> None:
    stale = "a\n<!-- figures:demo -->\n| 1 | idle | 1 s |\n<!-- /figures:demo -->\nb\n"
    empty = "a\n<!-- figures:demo -->\n<!-- /figures:demo -->\nb\n"
    assert readme_figures.render(stale) == readme_figures.render(empty)
    assert readme_figures.demo() in readme_figures.render(empty)
