"""One governed task per row of the outcome table, for tests that run on a Redis of their own.

Such tests need a Celery app of their own (a producer pool sticks to the first
broker it used), so the tasks are defined on the app a test module passes in,
and on that app only (``shared=False``: the same names serve several apps).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from polygate_celery import GatewayConfig, SourceFatalError, parse_config
from polygate_celery.celery import GovernedCalls, governed
from polygate_celery.testing.simulator import ModelBehaviour

HELLO = [{"role": "user", "content": "hello"}]


@dataclass
class OutcomeTasks:
    """`answer` succeeds (or defers with ``fail_fast=True`` while its source is paused),
    `answer_down` spends its retry budget, `refuse` fails fatally; `runs` counts `answer`."""

    answer: Any
    answer_down: Any
    refuse: Any
    runs: Counter[str] = field(default_factory=Counter)


def outcome_tasks(app: Celery) -> OutcomeTasks:
    runs: Counter[str] = Counter()

    @app.task(bind=True, shared=False)
    @governed("chat")
    def answer(self: Any, calls: GovernedCalls, fail_fast: bool = False) -> str:
        runs[self.request.id] += 1
        return calls.chat(HELLO, fail_fast=fail_fast).value.text

    @app.task(shared=False)
    @governed("down")
    def answer_down(calls: GovernedCalls) -> str:
        return calls.chat(HELLO).value.text

    @app.task(shared=False)
    @governed("chat")
    def refuse(calls: GovernedCalls) -> None:
        raise SourceFatalError("the request is malformed", "chat")

    return OutcomeTasks(answer, answer_down, refuse, runs)


def outcome_models(api_key: str | None = None) -> dict[str, ModelBehaviour]:
    """A model that answers "fine" and one that always fails with 500."""
    return {
        "up": ModelBehaviour(reply="fine", api_key=api_key),
        "down": ModelBehaviour(error_rates={500: 1.0}, api_key=api_key),
    }


def outcome_config(
    redis_url: str, prefix: str, provider_url: str, api_key: str | None = None
) -> GatewayConfig:
    """Scopes `chat` (on the answering model) and `down` (on the failing one), both quick."""
    source: dict[str, Any] = {"base_url": provider_url, "timeout_s": 2}
    if api_key is not None:
        source["api_key"] = api_key
    scope = {"kind": "chat", "max_attempts": 2, "stall_window_s": 1, "poll_interval_s": 0.1}
    scope |= {"backoff_base_s": 0.05, "backoff_max_s": 0.1}
    return parse_config(
        {
            "store": {"redis_url": redis_url, "key_prefix": prefix},
            "deferral": {"min_delay_s": 0.2, "max_delay_s": 1, "release_interval_s": 0.05},
            "sources": {
                "main": {**source, "model": "up"},
                "broken": {**source, "model": "down"},
            },
            "scopes": {
                "chat": {**scope, "sources": ["main"]},
                # Every failure burns the retry budget: a lone call on a source that
                # is down would otherwise defer (SPEC §3 rule 15).
                "down": {**scope, "sources": ["broken"], "outage_is_waiting": False},
            },
        }
    )
