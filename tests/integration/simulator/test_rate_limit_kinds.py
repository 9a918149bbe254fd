"""The simulator's two kinds of rate limit, and the rate-limit headers real providers send."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("aiohttp", reason="the simulator is an extra: polygate_celery[simulator]")

from polygate_celery.sources.classify import rate_limits
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from polygate_celery.testing.simulator.admission import Admission

CHAT = [{"role": "user", "content": "x" * 40}]  # 10 prompt tokens


def test_a_bucket_refills_continuously() -> None:
    """A full minute's allowance at once, then one request every 60 / rpm seconds."""
    admission = Admission(ModelBehaviour(rpm=60, rate_limiter="bucket"))
    assert all(admission.admit(0.0, 0) is None for _ in range(60))
    for _ in range(60):
        admission.release()
    refused = admission.admit(0.0, 0)
    assert refused is not None
    assert refused.outcome == "429-rpm"
    assert refused.retry_after_s == pytest.approx(1.0)
    assert admission.admit(1.0, 0) is None  # one request's worth refilled
    assert admission.admit(1.0, 0) is not None


def test_a_window_waits_for_the_minute() -> None:
    admission = Admission(ModelBehaviour(rpm=60))
    assert all(admission.admit(0.0, 0) is None for _ in range(60))
    refused = admission.admit(1.0, 0)
    assert refused is not None
    assert refused.retry_after_s == pytest.approx(59.0)


def test_a_token_bucket_counts_tokens() -> None:
    admission = Admission(ModelBehaviour(tpm=600, rate_limiter="bucket"))
    assert admission.admit(0.0, 600) is None
    refused = admission.admit(0.0, 60)
    assert refused is not None
    assert (refused.outcome, refused.retry_after_s) == ("429-tpm", pytest.approx(6.0))


@pytest.mark.parametrize("limiter", ["window", "bucket"])
def test_limits_report_what_is_left_and_when_it_is_full_again(limiter: str) -> None:
    admission = Admission(ModelBehaviour(rpm=120, tpm=1000, rate_limiter=limiter))  # type: ignore[arg-type]
    for _ in range(30):
        assert admission.admit(0.0, 10) is None
    found = admission.limits(0.0)
    assert (found["requests"].limit, found["requests"].remaining) == (120, 90)
    assert (found["tokens"].limit, found["tokens"].remaining) == (1000, 700)
    expected_reset = 15.0 if limiter == "bucket" else 60.0  # 30 of 120 a minute; the window
    assert found["requests"].reset_s == pytest.approx(expected_reset)


@pytest.mark.parametrize("style", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_every_answer_carries_the_headers_our_sources_read(style: str, stream: bool) -> None:
    behaviour = ModelBehaviour(
        reply="hi",
        rpm=120,
        tpm=100_000,
        rate_limiter="bucket",
        ratelimit_headers=style,  # type: ignore[arg-type]
    )
    with SimulatedProvider({"m": behaviour}) as provider:
        body: dict[str, Any] = {"model": "m", "messages": CHAT, "stream": stream}
        answers = [
            httpx.post(f"{provider.url}/chat/completions", json=body, timeout=10) for _ in range(3)
        ]
    assert [a.status_code for a in answers] == [200] * 3
    read = rate_limits(answers[-1].headers)
    assert read is not None
    assert (read.requests_limit, read.requests_remaining) == (120, 117)
    assert read.tokens_limit == 100_000
    assert read.requests_reset_s is not None
    assert 0 < read.requests_reset_s <= 3.0  # three requests of a 120 RPM bucket: 1.5 s


def test_a_429_carries_them_too() -> None:
    behaviour = ModelBehaviour(rpm=2, rate_limiter="bucket", ratelimit_headers="openai")
    with SimulatedProvider({"m": behaviour}) as provider:
        body = {"model": "m", "messages": CHAT}
        answers = [
            httpx.post(f"{provider.url}/chat/completions", json=body, timeout=10) for _ in range(3)
        ]
    assert [a.status_code for a in answers] == [200, 200, 429]
    read = rate_limits(answers[-1].headers)
    assert read is not None
    assert (read.requests_limit, read.requests_remaining) == (2, 0)


def test_no_headers_unless_asked() -> None:
    with SimulatedProvider({"m": ModelBehaviour(rpm=60)}) as provider:
        answer = httpx.post(
            f"{provider.url}/chat/completions", json={"model": "m", "messages": CHAT}, timeout=10
        )
    assert rate_limits(answer.headers) is None
