"""The manual builds with ``mkdocs build --strict``: no broken link, anchor or API reference.

``.ci/run`` builds it too (``make docs``); this keeps ``make test`` alone from passing
with a site that does not build.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "reference" / "api" / "index.html").exists()
    changelog = (tmp_path / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "Unreleased" in changelog  # CHANGELOG.md is included, not copied
