"""The README quotes only figures the committed results files hold (as the configuration
reference is checked against the models)."""

from __future__ import annotations

from benchmarks import readme_figures


def test_every_figure_block_of_the_readme_is_what_the_results_say() -> None:
    readme = readme_figures.README.read_text(encoding="utf-8")
    assert readme_figures.render(readme) == readme, (
        "README.md's figures differ from benchmarks/: run `python benchmarks/readme_figures.py "
        "--write`"
    )
