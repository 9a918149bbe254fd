"""The main job: the demo runs the example pipeline end to end on an embedded Redis."""

from __future__ import annotations

import io

import pytest

from polygate_celery.pipeline_demo import DemoError, run


def test_the_demo_accounts_for_every_task_on_an_embedded_redis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POLYGATE_REDIS_URL", raising=False)  # as on a machine without Redis
    out = io.StringIO()
    assert run(documents=6, pages=2, out=out, outage=(0.5, 7.5), timeout_s=120) == 0
    text = out.getvalue()
    assert "an embedded server" in text
    assert "30 of 30 tasks accounted for" in text  # 12 OCR + 12 embed + 6 summaries
    summary = text.split("Done in", 1)[1]
    assert "summarise      6          6       0" in summary


def test_an_unreachable_redis_given_explicitly_is_one_clear_error() -> None:
    with pytest.raises(DemoError, match=r"cannot reach Redis at 127\.0\.0\.1:1$"):
        run(documents=1, redis_url="redis://127.0.0.1:1/0")
