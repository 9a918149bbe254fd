"""Source layer: the adapters a configuration describes."""

from __future__ import annotations

from typing import Any

from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.models import SourceConfig
from polygate_celery.errors import ConfigError
from polygate_celery.sources.exchange import (
    DEFAULT_OCR_PROMPT,
    MAX_BODY_BYTES,
    OpenAIStyleSource,
)
from polygate_celery.sources.http import OpenAIHttpSource
from polygate_celery.sources.sdk import OpenAISDKSource, openai_module

DEFAULT_TTFT_S = 15.0
"""A streamed chat answer's first token, when `ttft_timeout_s` is unset: a stuck first
token fails over within this long (see `SourceSettings.ttft_timeout_s`)."""


def source_from_config(
    name: str, source: SourceConfig, *, include_bodies: bool = False
) -> OpenAIStyleSource:
    """The HTTP (or openai SDK) adapter of one configured source."""
    if not source.base_url:
        raise ConfigError(f"sources.{name}.base_url", "needed to reach this source")
    if not source.model:
        raise ConfigError(f"sources.{name}.model", "needed to call this source")
    stream = source.stream if source.stream is not None else source.ttft_timeout_s is not None
    ttft_s = source.ttft_timeout_s if source.ttft_timeout_s is not None else DEFAULT_TTFT_S
    body_limit = source.max_body_bytes if source.max_body_bytes is not None else MAX_BODY_BYTES
    if source.adapter == "openai-sdk":
        openai = openai_module()
        key = source.key.get_secret_value() if source.key is not None else "unused"
        base_url = source.base_url

        def client() -> Any:  # one per event loop, error answers held to the body limit
            from polygate_celery.sources.sdk_http import bounded_http_client  # noqa: PLC0415

            return openai.AsyncOpenAI(
                api_key=key,
                base_url=base_url,
                max_retries=0,
                http_client=bounded_http_client(body_limit),
            )

        return OpenAISDKSource(
            client_factory=client,
            model=source.model,
            stream=stream,
            stream_usage=source.stream_usage,
            ttft_timeout_s=ttft_s,
            stream_idle_timeout_s=source.stream_idle_timeout_s,
            ocr_prompt=source.ocr_prompt or DEFAULT_OCR_PROMPT,
            include_bodies=include_bodies,
            max_body_bytes=body_limit,
        )
    return OpenAIHttpSource(
        base_url=source.base_url,
        model=source.model,
        api_key=source.key,
        stream=stream,
        stream_usage=source.stream_usage,
        ttft_timeout_s=ttft_s,
        stream_idle_timeout_s=source.stream_idle_timeout_s,
        ocr_endpoint=source.ocr_endpoint,
        ocr_prompt=source.ocr_prompt or DEFAULT_OCR_PROMPT,
        include_bodies=include_bodies,
        max_body_bytes=body_limit,
    )


def sources_from_config(config: GatewayConfig) -> dict[str, OpenAIStyleSource]:
    """An adapter for every source some scope uses."""
    used = {name for scope in config.scopes.values() for name in scope.sources}
    return {
        name: source_from_config(name, config.sources[name], include_bodies=config.include_bodies)
        for name in sorted(used)
    }
