"""What real providers do beyond the simulator: each read as an outcome, never a crash."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pydantic import SecretStr

from polygate_celery import ConfigError, parse_config
from polygate_celery.core.outcome import Outcome, OutcomeKind
from polygate_celery.sources import (
    ChatRequest,
    EmbeddingRequest,
    OpenAIHttpSource,
    close_http_client,
)
from tests.conftest import CANARY_KEY
from tests.integration.sources.rawserver import RawServer, chunk, fixed, sse_head

HELLO = ChatRequest([{"role": "user", "content": "hi"}])
pytestmark = pytest.mark.usefixtures("_close_client")


@pytest.fixture
async def _close_client() -> object:
    yield None
    await close_http_client()


async def ask(
    url: str, request: object = HELLO, timeout_s: float = 5.0, **options: object
) -> Outcome:
    source = OpenAIHttpSource(base_url=url, model="raw", api_key=SecretStr(CANARY_KEY), **options)
    return await source.send(request, timeout_s=timeout_s)


def completion(message: dict[str, object], finish: str = "stop") -> dict[str, object]:
    return {
        "model": "raw",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": "3", "completion_tokens": 4},
    }


async def test_a_tool_call_answer_is_a_success() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    async with RawServer(
        fixed(200, completion({"content": None, "tool_calls": [call]}, "tool_calls"))
    ) as server:
        outcome = await ask(server.url)
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.value.tool_calls == [call]
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (None, 4)  # "3" is no count


async def test_a_withheld_answer_is_fatal() -> None:
    async with RawServer(fixed(200, completion({"content": None}, "content_filter"))) as server:
        assert (await ask(server.url)).kind is OutcomeKind.FATAL


@pytest.mark.parametrize(
    "body",
    ["[" * 100_000 + "]" * 100_000, "not json at all", "[1, 2]", {"choices": []}],
)
async def test_a_bad_body_is_transient(body: object) -> None:
    async with RawServer(fixed(200, body)) as server:
        assert (await ask(server.url)).kind is OutcomeKind.TRANSIENT


@pytest.mark.parametrize(
    "items",
    [
        [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [2.0]}],
        [{"index": 0, "embedding": [1.0]}, {"index": 5, "embedding": [2.0]}],
        [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [float("nan")]}],
        [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}],
        [{"index": True, "embedding": [1.0]}, {"index": 1, "embedding": [2.0]}],
    ],
)
async def test_embeddings_that_do_not_match_their_inputs_are_refused(items: object) -> None:
    body = json.dumps({"data": items}).replace("NaN", "NaN")
    async with RawServer(fixed(200, body)) as server:
        outcome = await ask(server.url, EmbeddingRequest(["a", "b"]))
    assert outcome.kind is OutcomeKind.TRANSIENT


async def test_an_oversized_answer_is_refused_without_reading_it() -> None:
    async with RawServer(fixed(200, "x" * 5000)) as server:
        outcome = await ask(server.url, max_body_bytes=1000)
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert "larger than" in (outcome.reason or "")


async def test_a_401_body_is_never_quoted_even_with_bodies_on() -> None:
    echo = {
        "error": {"message": f"Incorrect API key provided: {CANARY_KEY[:6]}****{CANARY_KEY[-4:]}"}
    }
    async with RawServer(fixed(401, echo)) as server:
        outcome = await ask(server.url, include_bodies=True)
    assert outcome.credentials_rejected
    assert CANARY_KEY[:6] not in repr(outcome)
    assert CANARY_KEY[-4:] not in repr(outcome)


async def test_a_partial_key_echoed_in_another_error_is_redacted() -> None:
    echo = {"error": {"message": f"key {CANARY_KEY[:6]}...{CANARY_KEY[-4:]} may not use this"}}
    async with RawServer(fixed(400, echo)) as server:
        outcome = await ask(server.url, include_bodies=True)
    assert CANARY_KEY[:6] not in repr(outcome)
    assert CANARY_KEY[-4:] not in repr(outcome)


def test_a_key_a_header_cannot_carry_is_refused_at_load_without_echo(tmp_path) -> None:  # type: ignore[no-untyped-def]
    key_file = tmp_path / "key"
    key_file.write_text("\ufeffsk-secret-éé\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        parse_config({"sources": {"a": {"api_key_file": str(key_file)}}})
    assert "sk-secret" not in str(caught.value)
    key_file.write_text("\ufeffsk-secret-ok\n", encoding="utf-8")
    source = parse_config({"sources": {"a": {"api_key_file": str(key_file)}}}).sources["a"]
    assert source.key is not None
    assert source.key.get_secret_value() == "sk-secret-ok"  # the BOM and newline are gone


async def test_a_key_that_cannot_be_sent_is_an_outcome_without_the_key() -> None:
    async with RawServer(fixed(200, completion({"content": "x"}))) as server:
        source = OpenAIHttpSource(base_url=server.url, model="raw", api_key=SecretStr("sk-é"))
        outcome = await source.send(HELLO, timeout_s=2)
    assert outcome.kind is OutcomeKind.REJECTED
    assert outcome.credentials_rejected
    assert "sk-" not in repr(outcome)


async def test_parameters_that_are_not_json_are_the_callers_fault() -> None:
    outcome = await ask(
        "http://127.0.0.1:9/v1",
        ChatRequest([{"role": "user", "content": "x"}], {"temperature": float("nan")}),
    )
    assert outcome.kind is OutcomeKind.FATAL


# -- streams -----------------------------------------------------------------------------


def streaming(*parts: bytes | float) -> object:
    """Write the SSE head, then each part (bytes) or pause (seconds); hold the connection."""

    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(sse_head())
        for part in parts:
            if isinstance(part, (int, float)):
                await asyncio.sleep(part)
            else:
                writer.write(part)
                await writer.drain()
        await asyncio.sleep(30)

    return write


async def test_reasoning_counts_as_the_first_token() -> None:
    parts = [chunk({"reasoning_content": "thinking"}), 0.3] * 5
    async with RawServer(streaming(*parts, chunk({"content": "ok"}), chunk({}, "stop"))) as server:  # type: ignore[arg-type]
        outcome = await ask(server.url, stream=True, stream_usage=False, ttft_timeout_s=1.0)
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.value.reasoning == "thinking" * 5


async def test_streamed_tool_calls_are_assembled() -> None:
    first = {
        "tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}]
    }
    rest = {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}
    async with RawServer(streaming(chunk(first), chunk(rest), chunk({}, "tool_calls"))) as server:  # type: ignore[arg-type]
        outcome = await ask(server.url, stream=True, stream_usage=False)
    assert outcome.value.tool_calls == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]


async def test_the_first_token_limit_covers_waiting_for_headers() -> None:
    async def late(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3)
        writer.write(sse_head() + chunk({"content": "x"}) + chunk({}, "stop"))

    async with RawServer(late) as server:  # type: ignore[arg-type]
        started = time.monotonic()
        outcome = await ask(server.url, stream=True, ttft_timeout_s=0.5, timeout_s=6)
    assert (outcome.timed_out, "first token" in (outcome.reason or "")) == (True, True)
    assert time.monotonic() - started < 1.5


async def test_without_a_first_token_limit_the_idle_limit_waits_for_the_first_token() -> None:
    async with RawServer(streaming(1.5, chunk({"content": "late"}), chunk({}, "stop"))) as server:  # type: ignore[arg-type]
        outcome = await ask(server.url, stream=True, stream_usage=False, stream_idle_timeout_s=0.5)
    assert outcome.kind is OutcomeKind.SUCCESS


async def test_keep_alive_comments_are_not_progress() -> None:
    parts = [chunk({"content": "a"})] + [b": ping\n\n", 0.2] * 20
    async with RawServer(streaming(*parts)) as server:  # type: ignore[arg-type]
        started = time.monotonic()
        outcome = await ask(server.url, stream=True, stream_idle_timeout_s=0.5, timeout_s=10)
    assert (outcome.timed_out, outcome.reason) == (True, "stream went idle")
    assert time.monotonic() - started < 2.0


async def test_a_whole_answer_whose_usage_never_comes_is_still_a_success() -> None:
    async with RawServer(streaming(chunk({"content": "done"}), chunk({}, "stop"))) as server:  # type: ignore[arg-type]
        started = time.monotonic()
        outcome = await ask(server.url, stream=True, stream_idle_timeout_s=30, timeout_s=20)
    assert outcome.value.text == "done"
    assert time.monotonic() - started < 4.0  # a short grace, not the idle limit


async def test_a_plain_completion_sent_to_a_stream_request_is_read() -> None:
    async with RawServer(fixed(200, completion({"content": "plain"}))) as server:
        outcome = await ask(server.url, stream=True)
    assert outcome.value.text == "plain"


async def test_cancelling_a_stream_always_cancels_it() -> None:
    parts: list[bytes | float] = []
    for _ in range(300):
        parts += [chunk({"content": "x"}), 0.001]
    async with RawServer(streaming(*parts, chunk({}, "stop"))) as server:  # type: ignore[arg-type]
        for i in range(20):
            task = asyncio.ensure_future(ask(server.url, stream=True, stream_usage=False))
            await asyncio.sleep(0.05 + 0.003 * i)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
