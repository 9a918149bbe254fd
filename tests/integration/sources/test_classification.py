"""Every row of the classification table, every stream fault and every Retry-After
format, over real sockets against the simulated provider, for both adapters."""

from __future__ import annotations

import time

import pytest

from polygate_celery.core.outcome import Outcome, OutcomeKind
from polygate_celery.sources import (
    ChatRequest,
    ChatResult,
    EmbeddingRequest,
    EmbeddingResult,
    OcrRequest,
    OcrResult,
)
from tests.integration.sources.conftest import SourceFactory
from tests.redis_server import free_port

HELLO = ChatRequest([{"role": "user", "content": "hello"}])


async def ask(
    make_source: SourceFactory,
    model: str,
    request: object = HELLO,
    timeout_s: float = 5.0,
    **options: object,
) -> Outcome:
    return await make_source(model, **options).send(request, timeout_s=timeout_s)


async def test_a_complete_answer_is_a_success_naming_model_and_usage(
    make_source: SourceFactory,
) -> None:
    outcome = await ask(make_source, "ok")
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.value == ChatResult("the full answer", "stop")
    assert outcome.model == "ok"
    assert outcome.prompt_tokens is not None
    assert outcome.completion_tokens is not None


@pytest.mark.parametrize(
    ("model", "hint"),
    [("ratelimit-seconds", 7.0), ("ratelimit-ms", 1.5), ("ratelimit-none", None)],
)
async def test_429_with_each_retry_after_format(
    make_source: SourceFactory, model: str, hint: float | None
) -> None:
    outcome = await ask(make_source, model)
    assert (outcome.kind, outcome.status, outcome.retry_after_s) == (
        OutcomeKind.RATE_LIMITED,
        429,
        hint,
    )


async def test_a_queueing_gateways_429_at_exactly_the_timeout_is_a_429(
    make_source: SourceFactory,
) -> None:
    # The gateway answers 5 s after it reads the request, when the client's deadline
    # falls due; the tie grace there is 0.25 s. A first request first, so that the
    # gateway's answer is not late by what a fresh process's first request costs
    # (imports, the first connection: up to 0.45 s on a busy machine); what is left
    # is the scheduling jitter of a busy machine (up to 0.12 s measured with two
    # CPU-bound processes beside the suite).
    assert (await ask(make_source, "ok")).kind is OutcomeKind.SUCCESS
    outcome = await ask(make_source, "queued", timeout_s=5.0)
    assert (outcome.kind, outcome.retry_after_s) == (OutcomeKind.RATE_LIMITED, 5.0)


async def test_429_with_an_http_date(make_source: SourceFactory) -> None:
    outcome = await ask(make_source, "ratelimit-date")
    assert outcome.kind is OutcomeKind.RATE_LIMITED
    assert outcome.retry_after_s is not None
    assert 28 <= outcome.retry_after_s <= 31


@pytest.mark.parametrize(
    ("model", "status"), [("e408", 408), ("e409", 409), ("e500", 500), ("outage", 503)]
)
async def test_server_side_failures_are_transient(
    make_source: SourceFactory, model: str, status: int
) -> None:
    outcome = await ask(make_source, model)
    assert (outcome.kind, outcome.status) == (OutcomeKind.TRANSIENT, status)


async def test_no_answer_within_the_deadline_is_a_timeout(make_source: SourceFactory) -> None:
    started = time.monotonic()
    outcome = await ask(make_source, "slow", timeout_s=0.5)
    assert (outcome.kind, outcome.timed_out) == (OutcomeKind.TRANSIENT, True)
    assert time.monotonic() - started < 1.5


async def test_a_refused_connection_is_transient(make_source: SourceFactory) -> None:
    outcome = await ask(make_source, "ok", url=f"http://127.0.0.1:{free_port()}/v1")
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert not outcome.timed_out


async def test_a_malformed_body_is_transient_never_a_crash(make_source: SourceFactory) -> None:
    outcome = await ask(make_source, "malformed-body")
    assert outcome.kind is OutcomeKind.TRANSIENT


@pytest.mark.parametrize("model", ["context", "missing"])
async def test_what_only_this_source_cannot_serve_is_rejected(
    make_source: SourceFactory, model: str
) -> None:
    outcome = await ask(make_source, model)
    assert outcome.kind is OutcomeKind.REJECTED
    assert not outcome.credentials_rejected


@pytest.mark.parametrize(("model", "status"), [("wrong-key", 401), ("forbidden", 403)])
async def test_credentials_errors_reject_the_source(
    make_source: SourceFactory, model: str, status: int
) -> None:
    outcome = await ask(make_source, model)
    assert (outcome.kind, outcome.status, outcome.credentials_rejected) == (
        OutcomeKind.REJECTED,
        status,
        True,
    )


@pytest.mark.parametrize(
    ("model", "status", "reason"),
    [
        ("policy", 400, "safety system"),
        ("bad-request", 400, "temperature"),
        ("unprocessable", 422, None),
    ],
)
async def test_bad_requests_are_fatal_with_the_providers_reason(
    make_source: SourceFactory, model: str, status: int, reason: str | None
) -> None:
    outcome = await ask(make_source, model)
    assert (outcome.kind, outcome.status) == (OutcomeKind.FATAL, status)
    if reason:
        assert reason in (outcome.reason or "")


# -- streams ---------------------------------------------------------------------------


async def test_a_whole_stream_is_assembled_with_its_usage(make_source: SourceFactory) -> None:
    outcome = await ask(make_source, "ok", stream=True)
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.value == ChatResult("the full answer", "stop")
    assert outcome.completion_tokens is not None


async def test_a_stream_whose_final_chunk_arrived_completes_without_done(
    make_source: SourceFactory,
) -> None:
    started = time.monotonic()
    outcome = await ask(make_source, "no-done", stream=True, stream_idle_timeout_s=5.0)
    assert outcome.value == ChatResult("complete without done", "stop")
    assert time.monotonic() - started < 2.0  # not the 5 s idle limit


@pytest.mark.parametrize("model", ["cut", "malformed-chunk"])
async def test_a_broken_stream_is_transient_never_a_success(
    make_source: SourceFactory, model: str
) -> None:
    outcome = await ask(make_source, model, stream=True)
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert not outcome.timed_out


async def test_a_malformed_stream_carries_its_2xx_status_never_passing_for_a_5xx(
    make_source: SourceFactory,
) -> None:
    """The loop retries a 5xx or a lost connection (no status) on the same source once; a
    malformed stream was answered, and moves to another source at once."""
    outcome = await ask(make_source, "malformed-chunk", stream=True)
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert (outcome.reason or "").startswith("malformed stream")
    assert outcome.status == 200


async def test_a_stalled_stream_times_out_on_its_idle_limit(make_source: SourceFactory) -> None:
    started = time.monotonic()
    outcome = await ask(make_source, "stall", stream=True, stream_idle_timeout_s=0.5)
    assert (outcome.kind, outcome.timed_out) == (OutcomeKind.TRANSIENT, True)
    assert time.monotonic() - started < 2.0


async def test_a_slow_first_token_times_out_on_ttft(make_source: SourceFactory) -> None:
    started = time.monotonic()
    outcome = await ask(make_source, "slow-first-token", stream=True, ttft_timeout_s=0.5)
    assert (outcome.kind, outcome.timed_out) == (OutcomeKind.TRANSIENT, True)
    assert "first token" in (outcome.reason or "")
    assert time.monotonic() - started < 2.0


# -- embeddings and OCR ----------------------------------------------------------------


async def test_embeddings_come_back_one_vector_per_input(make_source: SourceFactory) -> None:
    outcome = await ask(make_source, "ok", EmbeddingRequest(["a", "bb", "ccc"]))
    assert isinstance(outcome.value, EmbeddingResult)
    assert len(outcome.value.vectors) == 3
    assert outcome.prompt_tokens is not None


async def test_embeddings_classify_like_chat(make_source: SourceFactory) -> None:
    outcome = await ask(make_source, "ratelimit-seconds", EmbeddingRequest(["a"]))
    assert (outcome.kind, outcome.retry_after_s) == (OutcomeKind.RATE_LIMITED, 7.0)


async def test_ocr_by_vision_chat(make_source: SourceFactory) -> None:
    outcome = await ask(make_source, "ok", OcrRequest(b"\x89PNG" + b"0" * 96))
    assert outcome.value == OcrResult("text of a 100-byte image")


async def test_ocr_by_a_json_endpoint(make_source: SourceFactory) -> None:
    if make_source.kind == "sdk":  # type: ignore[attr-defined]
        pytest.skip("the openai SDK speaks the chat API only")
    outcome = await ask(make_source, "ok", OcrRequest(b"x" * 10), ocr_endpoint="/ocr")
    assert outcome.value == OcrResult("text of a 10-byte image")
