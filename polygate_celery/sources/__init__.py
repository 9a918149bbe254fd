"""Source layer: adapters that send one request to one model source and classify the outcome."""

from polygate_celery.sources.base import FirstTokenSource, Source
from polygate_celery.sources.callable import CallableSource
from polygate_celery.sources.classify import classify_error, rate_limits, retry_after_s
from polygate_celery.sources.factory import source_from_config, sources_from_config
from polygate_celery.sources.http import OpenAIHttpSource, close_http_client, http_client
from polygate_celery.sources.payloads import (
    ChatRequest,
    ChatResult,
    EmbeddingRequest,
    EmbeddingResult,
    OcrRequest,
    OcrResult,
    estimate_tokens,
)
from polygate_celery.sources.sdk import OpenAISDKSource

__all__ = [
    "CallableSource",
    "ChatRequest",
    "ChatResult",
    "EmbeddingRequest",
    "EmbeddingResult",
    "FirstTokenSource",
    "OcrRequest",
    "OcrResult",
    "OpenAIHttpSource",
    "OpenAISDKSource",
    "Source",
    "classify_error",
    "close_http_client",
    "estimate_tokens",
    "http_client",
    "rate_limits",
    "retry_after_s",
    "source_from_config",
    "sources_from_config",
]
