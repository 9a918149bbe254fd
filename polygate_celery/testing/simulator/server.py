"""Testing: the simulator's aiohttp application — one request path for every endpoint.

Each request walks the same gates in order: body, model, key, parse, reject,
outage, queueing, admission (capacity, rpm, tpm), drawn error, then the answer.
Chat, embeddings and OCR differ only by an `Endpoint` policy; stream faults
live in `streaming`.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from typing import Any

try:
    from aiohttp import web
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "the simulated provider needs aiohttp: pip install 'polygate_celery[simulator]'",
        name=exc.name,
    ) from exc

from polygate_celery.testing.simulator import answers, prompts
from polygate_celery.testing.simulator.admission import Admission, Limit
from polygate_celery.testing.simulator.behaviour import ModelBehaviour, RetryAfterFormat
from polygate_celery.testing.simulator.journal import Journal, JournalEntry, Visit
from polygate_celery.testing.simulator.streaming import stream_chat

# How long shutdown waits for open requests (stalls, slow first tokens) before cancelling them.
SHUTDOWN_S = 0.1
# A 200 whose body is neither JSON nor a completion (`status_body_malformed`).
MALFORMED_BODY = '{"id": "chatcmpl-sim", "object": "chat.completion", "choices": ['

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Render = Callable[[str, str, prompts.Prompt, ModelBehaviour], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What distinguishes one endpoint: how to read its request and shape its answer."""

    path: str
    parse: Callable[[Mapping[str, Any], ModelBehaviour], prompts.Prompt]
    render: Render  # (answer id, model, prompt, behaviour) -> body


def _render_chat(answer_id: str, model: str, p: prompts.Prompt, b: ModelBehaviour) -> Any:
    return answers.chat_completion(answer_id, model, int(time.time()), p)


def _render_embeddings(answer_id: str, model: str, p: prompts.Prompt, b: ModelBehaviour) -> Any:
    return answers.embeddings(model, p, b.embedding_dim)


def _render_ocr(answer_id: str, model: str, p: prompts.Prompt, b: ModelBehaviour) -> Any:
    return answers.ocr(model, p)


ENDPOINTS = (
    Endpoint("/chat/completions", prompts.parse_chat, _render_chat),
    Endpoint("/embeddings", prompts.parse_embeddings, _render_embeddings),
    Endpoint("/ocr", prompts.parse_ocr, _render_ocr),
)


def retry_headers(style: RetryAfterFormat, seconds: float | None) -> dict[str, str]:
    """The 429 hint in the model's chosen style, rounded up so that it is never too early."""
    if seconds is None or style == "none":
        return {}
    if style == "ms":
        return {"retry-after-ms": str(math.ceil(max(0.0, seconds) * 1000))}
    whole = math.ceil(max(0.0, seconds))
    if style == "http-date":
        return {"Retry-After": formatdate(math.ceil(time.time()) + whole, usegmt=True)}
    return {"Retry-After": str(whole)}


def ratelimit_headers(style: str, limits: Mapping[str, Limit]) -> dict[str, str]:
    """Rate-limit headers as OpenAI (``x-ratelimit-*``, resets as durations such as
    ``6m0s``) or Anthropic (``anthropic-ratelimit-*``, resets as RFC 3339 instants) send them."""
    headers: dict[str, str] = {}
    for name, limit in limits.items():
        if style == "openai":
            headers[f"x-ratelimit-limit-{name}"] = str(limit.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(limit.remaining)
            headers[f"x-ratelimit-reset-{name}"] = _duration(limit.reset_s)
        elif style == "anthropic":
            reset = datetime.fromtimestamp(math.ceil(time.time() + limit.reset_s), UTC)
            headers[f"anthropic-ratelimit-{name}-limit"] = str(limit.limit)
            headers[f"anthropic-ratelimit-{name}-remaining"] = str(limit.remaining)
            headers[f"anthropic-ratelimit-{name}-reset"] = reset.strftime("%Y-%m-%dT%H:%M:%SZ")
    return headers


def _duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    rest = math.ceil(rest * 1000) / 1000
    return f"{int(minutes)}m{rest:g}s" if minutes else f"{rest:g}s"


def _bearer_matches(request: web.Request, key: str) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


class Simulator:
    """The models, their admission state and the journal, served as an aiohttp application."""

    def __init__(
        self,
        models: Mapping[str, ModelBehaviour],
        *,
        seed: int = 0,
        any_model: ModelBehaviour | None = None,
    ) -> None:
        self.models = dict(models)
        self.any_model = any_model  # served for a name not in `models` (else: 404)
        self.journal = Journal()
        self.admissions = {name: Admission(b) for name, b in self.models.items()}
        self.first_request_at: dict[str, float] = {}  # by model, seconds since start
        for name, behaviour in self.models.items():
            if behaviour.outages_from not in ("start", *self.models):
                raise ValueError(
                    f"{name}: outages_from {behaviour.outages_from!r} is neither 'start' nor "
                    "a model of this provider"
                )
        self._random = random.Random(seed)
        self._serial = itertools.count(1)
        self._started = time.monotonic()

    def since_start(self) -> float:
        return time.monotonic() - self._started

    def application(self) -> web.Application:
        app = web.Application()
        for endpoint in ENDPOINTS:
            app.router.add_post(f"/v1{endpoint.path}", self._handler(endpoint))
        return app

    async def start(self, port: int, host: str = "127.0.0.1") -> tuple[web.AppRunner, int]:
        """Listen on `host`:`port` (0: any free port); the clock starts now."""
        runner = web.AppRunner(
            self.application(),
            handler_cancellation=True,  # a client that leaves ends its stall
            shutdown_timeout=SHUTDOWN_S,
            access_log=None,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._started = time.monotonic()
        return runner, int(runner.addresses[0][1])

    def record(self, visit: Visit, status: int, outcome: str) -> None:
        prompt = visit.prompt
        self.journal.append(
            JournalEntry(
                at=visit.at,
                model=visit.model,
                path=visit.path,
                stream=visit.stream,
                status=status,
                outcome=outcome,
                prompt_tokens=prompt.prompt_tokens if prompt else 0,
                completion_tokens=prompt.completion_tokens if prompt and status == 200 else 0,
                authorized=visit.authorized,
                ended=self.since_start(),
            )
        )
        visit.recorded = True

    def _handler(
        self, endpoint: Endpoint
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            visit = Visit(at=self.since_start(), path=request.path)
            try:
                return await self._serve(endpoint, request, visit)
            except asyncio.CancelledError:
                if not visit.recorded:
                    self.record(visit, visit.answered or 499, "client-gone")
                raise

        return handle

    def _fail(self, visit: Visit, failure: answers.Failure) -> web.Response:
        self.record(visit, failure.status, failure.outcome)
        behaviour = self.models.get(visit.model)
        style = behaviour.retry_after if behaviour else "none"
        headers = retry_headers(style, failure.retry_after_s) if failure.status == 429 else {}
        headers |= self._limit_headers(visit.model)
        return web.json_response(failure.body, status=failure.status, headers=headers)

    def _limit_headers(self, model: str | None) -> dict[str, str]:
        behaviour = self.models.get(model) if model is not None else None
        if behaviour is None or behaviour.ratelimit_headers == "none":
            return {}
        limits = self.admissions[model].limits(self.since_start()) if model else {}
        return ratelimit_headers(behaviour.ratelimit_headers, limits)

    def _since_outage_origin(self, behaviour: ModelBehaviour, at: float) -> float | None:
        if behaviour.outages_from == "start":
            return at
        origin = self.first_request_at.get(behaviour.outages_from)
        return None if origin is None else at - origin

    async def _serve(
        self, endpoint: Endpoint, request: web.Request, visit: Visit
    ) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return self._fail(visit, answers.bad_request("The body is not valid JSON.", None))
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            return self._fail(visit, answers.bad_request("'model' is required.", "model"))
        visit.model = model
        behaviour = self.models.get(model)
        if behaviour is None and self.any_model is not None:
            behaviour = self.models[model] = self.any_model
            self.admissions[model] = Admission(behaviour)
        if behaviour is None:
            return self._fail(visit, answers.unknown_model(model))
        self.first_request_at.setdefault(model, visit.at)
        if behaviour.api_key is not None:
            visit.authorized = _bearer_matches(request, behaviour.api_key)
            if not visit.authorized:
                return self._fail(visit, answers.unauthorized())
        try:
            prompt = endpoint.parse(body, behaviour)
        except prompts.BadRequest as exc:
            return self._fail(visit, answers.bad_request(str(exc), exc.param))
        visit.prompt, visit.stream = prompt, prompt.stream
        if behaviour.reject is not None:
            return self._fail(visit, answers.rejection(behaviour.reject, model))
        if behaviour.in_outage(self._since_outage_origin(behaviour, visit.at)):
            return self._fail(visit, answers.server_error(503, "503-outage"))
        admission = self.admissions[model]
        if behaviour.queueing_s is not None:
            return await self._hold(visit, behaviour, admission)
        refusal = admission.admit(visit.at, prompt.total_tokens)
        if refusal is not None:
            return self._fail(visit, answers.rate_limited(refusal.outcome, refusal.retry_after_s))
        try:
            return await self._answer(endpoint, request, visit, behaviour, prompt)
        finally:
            admission.release()

    async def _hold(
        self, visit: Visit, behaviour: ModelBehaviour, admission: Admission
    ) -> web.Response:
        """`queueing_s`: occupy a slot for that long, then give up with a 429."""
        refusal = admission.admit(visit.at, 0, charge=False)
        if refusal is not None:
            return self._fail(visit, answers.rate_limited(refusal.outcome, refusal.retry_after_s))
        try:
            await asyncio.sleep(behaviour.queueing_s or 0.0)
        finally:
            admission.release()
        return self._fail(visit, answers.rate_limited("429-queued", behaviour.retry_after_s))

    async def _answer(
        self,
        endpoint: Endpoint,
        request: web.Request,
        visit: Visit,
        behaviour: ModelBehaviour,
        prompt: prompts.Prompt,
    ) -> web.StreamResponse:
        if behaviour.poison is not None and behaviour.poison in prompt.text:
            await asyncio.sleep(self._latency(behaviour))
            return self._fail(visit, answers.server_error(500, "500-poison"))
        status = self._draw_error(behaviour)
        if status is not None:
            failure = answers.server_error(status, f"{status}-error", behaviour.retry_after_s)
            return self._fail(visit, failure)
        answer_id = f"sim-{next(self._serial)}"
        if prompt.stream and endpoint.path == "/chat/completions":
            return await stream_chat(
                request,
                visit,
                behaviour,
                prompt,
                answer_id,
                self._latency(behaviour),
                self.record,
                extra_headers=self._limit_headers(visit.model),
            )
        await asyncio.sleep(behaviour.first_token_s + self._latency(behaviour))
        if behaviour.status_body_malformed:
            self.record(visit, 200, "malformed-body")
            return web.Response(text=MALFORMED_BODY, content_type="application/json")
        self.record(visit, 200, "ok")
        return web.json_response(
            endpoint.render(answer_id, visit.model, prompt, behaviour),
            headers=self._limit_headers(visit.model),
        )

    def _draw_error(self, behaviour: ModelBehaviour) -> int | None:
        if not behaviour.error_rates:
            return None
        draw, cumulative = self._random.random(), 0.0
        for status in sorted(behaviour.error_rates):
            cumulative += behaviour.error_rates[status]
            if draw < cumulative:
                return status
        return None

    def _latency(self, behaviour: ModelBehaviour) -> float:
        low, high = behaviour.latency_s
        return self._random.uniform(low, high) if high > 0 else 0.0
