"""The simulated provider, over real HTTP: answer shapes, limits, faults, journal and CLI."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("aiohttp", reason="the simulator is an extra: polygate_celery[simulator]")

from polygate_celery.testing.simulator import (
    JournalEntry,
    ModelBehaviour,
    SimulatedProvider,
)
from polygate_celery.testing.simulator.admission import Admission

CHAT = [{"role": "user", "content": "x" * 40}]  # 10 prompt tokens
PNG = base64.b64encode(b"\x89PNG" + bytes(96)).decode()  # 100 bytes


@contextmanager
def serve(**fields: Any) -> Iterator[SimulatedProvider]:
    """One model, "m", behaving as `fields` say."""
    with SimulatedProvider({"m": ModelBehaviour(**fields)}) as provider:
        yield provider


def chat(provider: SimulatedProvider, **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": CHAT, **extra}
    return httpx.post(f"{provider.url}/chat/completions", json=body, timeout=5)


def events(lines: list[str]) -> list[Any]:
    """The decoded `data:` payloads of an SSE stream ("[DONE]" kept as a string)."""
    payloads = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def read_stream(
    provider: SimulatedProvider, read_s: float = 5.0, **extra: Any
) -> tuple[list[str], httpx.TransportError | None]:
    """Every line read until the stream ends or breaks, and what broke it."""
    body = {"model": "m", "messages": CHAT, "stream": True, **extra}
    lines: list[str] = []
    timeout = httpx.Timeout(5.0, read=read_s)
    url = f"{provider.url}/chat/completions"
    try:
        with httpx.stream("POST", url, json=body, timeout=timeout) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            lines.extend(r.iter_lines())
    except httpx.TransportError as exc:
        return lines, exc
    return lines, None


def stream_lines(provider: SimulatedProvider, **extra: Any) -> list[str]:
    lines, error = read_stream(provider, **extra)
    assert error is None
    return lines


# ---- answer shapes ----


def test_chat_completion_has_the_openai_shape() -> None:
    with serve(reply="hello from the simulator") as provider:
        body = chat(provider).json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "m"
    assert isinstance(body["id"], str)
    assert isinstance(body["created"], int)
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello from the simulator"},
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}


def test_an_image_part_is_described_by_its_decoded_size() -> None:
    parts = [
        {"type": "text", "text": "read this"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    ]
    with serve() as provider:
        body = chat(provider, messages=[{"role": "user", "content": parts}]).json()
    assert body["choices"][0]["message"]["content"] == "text of a 100-byte image"


def test_max_tokens_truncates_the_answer() -> None:
    with serve(reply="a" * 40) as provider:
        choice = chat(provider, max_tokens=2).json()["choices"][0]
    assert choice == {
        "index": 0,
        "message": {"role": "assistant", "content": "a" * 8},
        "finish_reason": "length",
    }


@pytest.mark.parametrize("include_usage", [True, False])
def test_stream_has_role_content_finish_usage_and_done(include_usage: bool) -> None:
    with serve(reply="one two three four") as provider:
        lines = stream_lines(provider, stream_options={"include_usage": include_usage})
    got = events(lines)
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    if include_usage:
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "total_tokens": 14,
        }
        chunks = chunks[:-1]
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    contents = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert len(contents) == 4
    assert "".join(contents) == "one two three four"


def test_embeddings_are_deterministic_vectors_of_the_configured_size() -> None:
    with serve(embedding_dim=5) as provider:
        url = f"{provider.url}/embeddings"
        many = httpx.post(url, json={"model": "m", "input": ["abcd", "efghijkl"]}).json()
        one = httpx.post(url, json={"model": "m", "input": "abcd"}).json()
    assert many["object"] == "list"
    assert many["model"] == "m"
    assert many["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert [d["index"] for d in many["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 5 for d in many["data"])
    assert one["data"][0]["embedding"] == many["data"][0]["embedding"]
    assert many["data"][0]["embedding"] != many["data"][1]["embedding"]


def test_ocr_reads_the_image_size() -> None:
    with serve() as provider:
        body = httpx.post(f"{provider.url}/ocr", json={"model": "m", "image": PNG}).json()
    assert body["model"] == "m"
    assert body["text"] == "text of a 100-byte image"
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens"}


def test_unknown_model_and_bad_body_are_openai_errors() -> None:
    with serve() as provider:
        missing = httpx.post(f"{provider.url}/chat/completions", json={"model": "nope"})
        bad = httpx.post(f"{provider.url}/embeddings", json={"model": "m", "input": 3})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"


def test_status_body_malformed_is_a_200_without_choices() -> None:
    with serve(status_body_malformed=True) as provider:
        response = chat(provider)
        assert response.status_code == 200
        with pytest.raises(json.JSONDecodeError):
            response.json()
        assert provider.journal[-1].outcome == "malformed-body"


# ---- limits ----


async def test_capacity_refuses_the_third_concurrent_request() -> None:
    async with SimulatedProvider({"m": ModelBehaviour(capacity=2, latency_s=(0.3, 0.3))}) as p:
        async with httpx.AsyncClient(base_url=p.url, timeout=5) as client:
            body = {"model": "m", "messages": CHAT}
            responses = await asyncio.gather(
                *(client.post("/chat/completions", json=body) for _ in range(3))
            )
        assert sorted(r.status_code for r in responses) == [200, 200, 429]
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.headers["Retry-After"] == "1"
        assert p.peak("m") == 2
        assert p.in_flight("m") == 0
        assert sorted(e.outcome for e in p.journal) == ["429-capacity", "ok", "ok"]


def test_rpm_refuses_with_a_truthful_hint() -> None:
    with serve(rpm=2) as provider:
        assert [chat(provider).status_code for _ in range(2)] == [200, 200]
        refused = chat(provider)
        assert provider.journal[-1].outcome == "429-rpm"
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 59 <= int(refused.headers["Retry-After"]) <= 60  # the first entry left ~60 s from now


def test_tpm_counts_prompt_and_completion_tokens() -> None:
    with serve(tpm=20) as provider:  # each call: 10 prompt + 4 completion tokens
        assert chat(provider).status_code == 200
        refused = chat(provider)
        assert provider.journal[-1].outcome == "429-tpm"
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60


@pytest.mark.parametrize(
    ("rpm", "tpm", "arrivals", "now", "expected"),
    [
        (2, None, [0.0, 10.0], 15.0, 45.0),  # the first arrival leaves at 60
        (3, None, [0.0, 10.0, 20.0, 30.0], 40.0, 20.0),  # 30 was refused: room at 60
        (None, 25, [0.0, 10.0], 15.0, 45.0),  # 10 + 10 + 10 > 25 until the first leaves
    ],
)
def test_rate_hint_is_exactly_when_the_window_admits(
    rpm: int | None, tpm: int | None, arrivals: list[float], now: float, expected: float
) -> None:
    admission = Admission(ModelBehaviour(rpm=rpm, tpm=tpm))
    for at in arrivals:
        if admission.admit(at, 10) is None:
            admission.release()
    refusal = admission.admit(now, 10)
    assert refusal is not None
    assert refusal.retry_after_s == pytest.approx(expected)
    assert admission.admit(now + expected - 0.001, 10) is not None
    assert admission.admit(now + expected, 10) is None


@pytest.mark.parametrize("style", ["seconds", "http-date", "ms", "none"])
def test_retry_after_styles(style: str) -> None:
    with serve(error_rates={429: 1.0}, retry_after=style, retry_after_s=2.5) as provider:
        response = chat(provider)
    assert response.status_code == 429
    if style == "seconds":
        assert response.headers["Retry-After"] == "3"
    elif style == "http-date":
        when = parsedate_to_datetime(response.headers["Retry-After"]).timestamp()
        assert time.time() + 1.5 <= when <= time.time() + 4.5
        assert response.headers["Retry-After"].endswith(" GMT")
    elif style == "ms":
        assert response.headers["retry-after-ms"] == "2500"
        assert "Retry-After" not in response.headers
    else:
        assert "Retry-After" not in response.headers
        assert "retry-after-ms" not in response.headers


def test_queueing_holds_then_refuses() -> None:
    with serve(queueing_s=0.2, retry_after_s=4) as provider:
        started = time.monotonic()
        response = chat(provider)
        held = time.monotonic() - started
        assert provider.journal[-1].outcome == "429-queued"
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "4"
    assert held >= 0.2


def test_outage_answers_503_inside_the_window_and_200_after() -> None:
    with serve(outages=((0.0, 0.4),)) as provider:
        inside = chat(provider)
        time.sleep(0.45)
        after = chat(provider)
        assert [e.outcome for e in provider.journal] == ["503-outage", "ok"]
    assert inside.status_code == 503
    assert inside.json()["error"]["type"] == "server_error"
    assert after.status_code == 200


def test_an_outage_can_count_from_a_models_first_request() -> None:
    """``outages_from``: the window opens with the named model's first request, whenever
    it comes; a model that shares it goes down with it, even before its own first request."""
    down = {"outages": ((0.0, 0.5),), "outages_from": "m"}
    models = {"m": ModelBehaviour(**down), "fallback": ModelBehaviour(**down)}
    with SimulatedProvider(models) as provider:
        body = {"messages": CHAT}
        post = f"{provider.url}/chat/completions"
        before = httpx.post(post, json={**body, "model": "fallback"}, timeout=5)
        time.sleep(0.6)  # long after the server started: a window from "start" is over
        first = httpx.post(post, json={**body, "model": "m"}, timeout=5)
        fallback = httpx.post(post, json={**body, "model": "fallback"}, timeout=5)
        time.sleep(0.55)
        after = httpx.post(post, json={**body, "model": "m"}, timeout=5)
    codes = [r.status_code for r in (before, first, fallback, after)]
    assert codes == [200, 503, 503, 200]
    with pytest.raises(ValueError, match="outages_from 'nobody' is neither 'start' nor a model"):
        SimulatedProvider({"m": ModelBehaviour(outages_from="nobody")}).start()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"messages": CHAT}),
        ("/embeddings", {"input": "text"}),
        ("/ocr", {"image": PNG}),
    ],
)
def test_error_rates_apply_to_every_endpoint(path: str, body: dict[str, Any]) -> None:
    with serve(error_rates={500: 1.0}) as provider:
        response = httpx.post(f"{provider.url}{path}", json={"model": "m", **body})
        assert provider.journal[-1].outcome == "500-error"
    assert response.status_code == 500


@pytest.mark.parametrize(
    ("reject", "status", "code"),
    [
        ("context_length", 400, "context_length_exceeded"),
        ("model_not_found", 404, "model_not_found"),
        ("auth", 401, "invalid_api_key"),
        ("forbidden", 403, "permission_denied"),
        ("content_policy", 400, "content_policy_violation"),
        ("bad_request", 400, None),
        ("unprocessable", 422, "unprocessable_entity"),
    ],
)
def test_every_reject_kind(reject: str, status: int, code: str | None) -> None:
    with serve(reject=reject) as provider:
        response = chat(provider)
        embedding = httpx.post(f"{provider.url}/embeddings", json={"model": "m", "input": "x"})
        assert provider.journal[-1].outcome == f"{status}-{reject}"
    assert response.status_code == embedding.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}
    if reject == "context_length":
        assert error["message"].startswith("This model's maximum context length is 8192 tokens")
        assert error["param"] == "messages"
    if reject == "content_policy":
        assert error["message"] == "Your request was rejected as a result of our safety system."
    if reject == "bad_request":
        assert error["message"] == "Invalid 'temperature': decimal above maximum value."


# ---- stream faults ----


def test_stall_sends_two_chunks_then_nothing() -> None:
    with serve(stream_fault="stall") as provider:
        lines, error = read_stream(provider, read_s=1.0)
        assert isinstance(error, httpx.ReadTimeout)
        got = events(lines)
        assert [c["choices"][0]["delta"] for c in got[1:]] == [
            {"content": "simu"},
            {"content": "late"},
        ]
        deadline = time.monotonic() + 2
        while provider.in_flight("m") and time.monotonic() < deadline:
            time.sleep(0.01)  # the server notices the client has gone
        assert provider.in_flight("m") == 0
        assert provider.journal[-1].outcome == "stall"


def test_cut_ends_the_stream_without_finish_reason() -> None:
    with serve(stream_fault="cut") as provider:
        lines, error = read_stream(provider)
        assert provider.journal[-1].outcome == "cut"
    assert isinstance(error, httpx.RemoteProtocolError)
    got = events(lines)
    assert len(got) == 3
    assert all(c["choices"][0]["finish_reason"] is None for c in got)


def test_malformed_sends_a_bad_data_line_then_continues() -> None:
    with serve(stream_fault="malformed") as provider:
        lines = stream_lines(provider)
    data = [line for line in lines if line.startswith("data: ")]
    assert data[1] == "data: {not json"
    rest = events(data[:1] + data[2:])
    assert rest[-1] == "[DONE]"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in rest[1:-1]) == (
        "simulated answer"
    )


def test_no_done_ends_after_the_finish_reason() -> None:
    with serve(stream_fault="no_done") as provider:
        lines = stream_lines(provider)
        deadline = time.monotonic() + 5  # journalled once the server has finished the stream
        while not provider.journal and time.monotonic() < deadline:
            time.sleep(0.01)
        assert provider.journal[-1].outcome == "no_done"
    got = events(lines)
    assert "[DONE]" not in got
    assert got[-1]["choices"][0]["finish_reason"] == "stop"


def test_slow_first_token_sends_nothing_for_a_long_while() -> None:
    with serve(stream_fault="slow_first_token") as provider:
        lines, error = read_stream(provider, read_s=0.3)
    assert isinstance(error, httpx.ReadTimeout)
    assert lines == []
    assert [(e.status, e.outcome) for e in provider.journal] == [(200, "client-gone")]


# ---- keys and journal ----


def test_api_key_mismatch_is_401_and_the_key_is_never_journalled() -> None:
    secret = "sk-simulated-secret-123"
    with serve(api_key=secret) as provider:
        url = f"{provider.url}/chat/completions"
        body = {"model": "m", "messages": CHAT}
        wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer sk-wrong-key"})
        right = httpx.post(url, json=body, headers={"Authorization": f"Bearer {secret}"})
        journal = provider.journal
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert "sk-wrong-key" not in wrong.text
    assert right.status_code == 200
    assert [(e.status, e.authorized) for e in journal] == [(401, False), (200, True)]
    assert secret not in repr(journal)
    assert "sk-wrong-key" not in repr(journal)
    assert secret not in repr(ModelBehaviour(api_key=secret))


def test_journal_records_each_request_and_can_be_reset() -> None:
    with serve() as provider:
        chat(provider)
        entry = provider.journal[0]
        assert isinstance(entry, JournalEntry)
        assert entry.model == "m"
        assert entry.path == "/v1/chat/completions"
        assert (entry.stream, entry.status, entry.outcome) == (False, 200, "ok")
        assert (entry.prompt_tokens, entry.completion_tokens) == (10, 4)
        assert entry.authorized is None
        assert entry.at >= 0
        assert provider.peak("m") == 1
        provider.reset_journal()
        assert provider.journal == []
        with pytest.raises(KeyError):
            provider.peak("unknown")


def test_behaviour_from_json_form_and_validation() -> None:
    behaviour = ModelBehaviour.from_dict(
        {"latency_s": [0.1, 0.2], "outages": [[1, 2]], "error_rates": {"503": 0.5}}
    )
    assert behaviour.latency_s == (0.1, 0.2)
    assert behaviour.outages == ((1.0, 2.0),)
    assert behaviour.error_rates == {503: 0.5}
    with pytest.raises(ValueError, match="unknown"):
        ModelBehaviour.from_dict({"latency": 1})
    with pytest.raises(ValueError, match="latency_s"):
        ModelBehaviour(latency_s=(2.0, 1.0))


# ---- command line and the optional dependency ----


@pytest.mark.parametrize("host", [[], ["--host", "0.0.0.0"]], ids=["loopback", "any-address"])
def test_cli_serves_the_configured_models(tmp_path: Path, host: list[str]) -> None:
    config = tmp_path / "models.json"
    config.write_text(json.dumps({"cli-model": {"reply": "from the cli", "latency_s": [0, 0]}}))
    command = [sys.executable, "-m", "polygate_celery.testing.simulator", "--port", "0", *host]
    process = subprocess.Popen(
        [*command, "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/v1")
        body = {"model": "cli-model", "messages": CHAT}
        answer = httpx.post(f"{url}/chat/completions", json=body, timeout=5).json()
        assert answer["choices"][0]["message"]["content"] == "from the cli"
    finally:
        process.terminate()
        assert process.wait(timeout=5) == 0
        if process.stdout is not None:
            process.stdout.close()


def test_cli_without_a_config_serves_any_model_name() -> None:
    """A configuration's own model names (the README's) work against the bare simulator."""
    command = [sys.executable, "-m", "polygate_celery.testing.simulator", "--port", "0"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        for model in ("qwen2.5-7b-instruct", "gpt-4o-mini"):
            body = {"model": model, "messages": CHAT}
            answer = httpx.post(f"{url}/chat/completions", json=body, timeout=5)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == model
    finally:
        process.terminate()
        assert process.wait(timeout=5) == 0
        if process.stdout is not None:
            process.stdout.close()


def test_missing_aiohttp_raises_with_the_install_hint() -> None:
    code = (
        "import sys; sys.modules['aiohttp'] = None\n"
        "try:\n    import polygate_celery.testing.simulator\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'polygate_celery[simulator]'" in out.stdout
