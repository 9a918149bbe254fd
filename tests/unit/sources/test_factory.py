"""Configured sources: what the adapters get from the configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polygate_celery import load_config, parse_config
from polygate_celery.sources import source_from_config
from polygate_celery.sources.exchange import MAX_BODY_BYTES
from polygate_celery.sources.factory import DEFAULT_TTFT_S


def adapter(**source: Any) -> Any:
    config = parse_config(
        {
            "sources": {"a": {"base_url": "http://127.0.0.1:9/v1", "model": "m", **source}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
        }
    )
    return source_from_config("a", config.sources["a"])


@pytest.mark.parametrize("kind", ["http", "openai-sdk"])
def test_a_streamed_first_token_has_a_15_s_limit_by_default(kind: str) -> None:
    made = adapter(stream=True, adapter=kind)
    assert DEFAULT_TTFT_S == 15.0
    assert made.ttft_timeout_s == 15.0


def test_a_configured_first_token_limit_is_kept() -> None:
    made = adapter(ttft_timeout_s=120)
    assert (made.stream, made.ttft_timeout_s) == (True, 120.0)


def test_the_default_does_not_turn_streaming_on() -> None:
    assert adapter().stream is False


@pytest.mark.parametrize("kind", ["http", "openai-sdk"])
def test_the_configured_body_limit_reaches_the_adapter(kind: str) -> None:
    assert adapter(adapter=kind, max_body_bytes=2_000_000).max_body_bytes == 2_000_000
    assert adapter(adapter=kind).max_body_bytes == MAX_BODY_BYTES  # unset: the adapter's own


def test_the_body_limit_is_a_setting_of_the_configuration_file(tmp_path: Path) -> None:
    path = tmp_path / "polygate.toml"
    path.write_text(
        '[source_defaults]\nmax_body_bytes = 4_194_304\n\n[sources.a]\nbase_url = "http://h/v1"\n'
        'model = "m"\n\n[scopes.s]\nkind = "chat"\nsources = ["a"]\n',
        encoding="utf-8",
    )
    config = load_config(path)
    assert source_from_config("a", config.sources["a"]).max_body_bytes == 4 * 1024 * 1024
