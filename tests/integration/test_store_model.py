"""Model-based test: breaker, permits, pauses and learned quotas of the Redis store
against a simple model.

Hypothesis drives random sequences of admissions, settlements (success,
transient failure, neutral, rejected credentials; some announcing the provider's
rate limits), pauses and clock moves against a real Redis, and checks every
answer and every snapshot against a short reference model written from the
specification, not from the code.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from polygate_celery.core.breaker import Effect
from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.quota import ARRIVAL_MARGIN_S
from polygate_celery.core.terms import BreakerTerms, SourceTerms
from polygate_celery.store import AdmitRequest, Denial, Grant, Settlement
from polygate_celery.store.redis import RedisStore
from polygate_celery.testing import VirtualClock

CAP, THRESHOLD, COOLDOWN_S, AUTH_COOLDOWN_S = 3, 2, 5.0, 40.0
TERMS = SourceTerms(
    "a",
    CAP,
    BreakerTerms(
        failure_threshold=THRESHOLD, cooldown_s=COOLDOWN_S, auth_cooldown_s=AUTH_COOLDOWN_S
    ),
)
RUNS, STEPS = 200, 50


@dataclass
class Model:
    """The specification in brief: a cap, a breaker with one probe, fleet-wide pauses."""

    now: float = 0.0
    held: set[str] = field(default_factory=set)
    mode: str = "closed"
    failures: int = 0
    open_until: float = 0.0
    probe: str | None = None
    paused_until: float = 0.0
    learned_rpm: int | None = None  # the limit the provider announced; its bucket's TAT
    learned_tat: float = -1e300

    def admit(self, permit: str) -> bool:
        if self.now < self.paused_until or len(self.held) >= CAP:
            return False
        takes_probe = (self.mode == "open" and self.now >= self.open_until) or (
            self.mode == "half_open" and self.probe is None
        )
        if self.mode != "closed" and not takes_probe:
            return False
        if self.learned_rpm is not None:  # one request of a bucket of learned_rpm a minute
            # checked as arriving now, charged as arriving ARRIVAL_MARGIN_S later
            interval = 60.0 / self.learned_rpm
            if max(self.learned_tat, self.now) + interval - 60.0 > self.now:
                return False
            self.learned_tat = max(self.learned_tat, self.now + ARRIVAL_MARGIN_S) + interval
        self.held.add(permit)
        if takes_probe:
            self.mode, self.probe = "half_open", permit
        return True

    def announce(self, limit: int, remaining: int) -> None:
        """Limit minus remaining counts as spent, never less than already counted."""
        spent = limit - min(max(remaining, 0), limit)
        self.learned_rpm = limit
        self.learned_tat = max(self.learned_tat, self.now + spent * 60.0 / limit)

    def settle(self, permit: str, effect: Effect) -> None:
        self.held.discard(permit)
        is_probe = permit == self.probe
        if effect is Effect.SUCCESS:
            self.mode, self.failures, self.probe = "closed", 0, None
        elif effect is Effect.AUTH_FAILURE:
            self.mode, self.probe = "open", None
            self.open_until = max(self.open_until, self.now + AUTH_COOLDOWN_S)
        elif effect is Effect.FAILURE:
            if is_probe:
                self.mode, self.probe, self.open_until = "open", None, self.now + COOLDOWN_S
            elif self.mode == "closed":
                self.failures += 1
                if self.failures >= THRESHOLD:
                    self.mode, self.open_until = "open", self.now + COOLDOWN_S
        elif is_probe:  # neutral: the probe proved nothing, the slot is free again
            self.probe = None


class StoreMachine(RuleBasedStateMachine):
    redis_url = ""
    runs = 0
    steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = VirtualClock()
        self.prefix = f"test-model-{uuid.uuid4().hex[:10]}"
        self.store = RedisStore.from_url(
            self.redis_url, prefix=self.prefix, clock=self.clock, lease_s=1e6
        )
        self.model = Model()
        self.held: dict[str, Grant] = {}
        self.ids = 0
        StoreMachine.runs += 1

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    @rule()
    def admit(self) -> None:
        self.ids += 1
        permit = f"p{self.ids}"
        answer = self.run(self.store.admit(AdmitRequest("s", (TERMS,), permit)))
        expected = self.model.admit(permit)
        assert isinstance(answer, Grant if expected else Denial), (answer, self.model)
        if isinstance(answer, Grant):
            self.held[permit] = answer

    @precondition(lambda self: bool(self.held))
    @rule(
        data=st.data(),
        effect=st.sampled_from(
            [Effect.SUCCESS, Effect.FAILURE, Effect.NEUTRAL, Effect.AUTH_FAILURE]
        ),
        announced=st.none() | st.tuples(st.sampled_from([1, 2, 4, 60]), st.integers(-1, 61)),
    )
    def settle(
        self, data: st.DataObject, effect: Effect, announced: tuple[int, int] | None
    ) -> None:
        permit = data.draw(st.sampled_from(sorted(self.held)))
        grant = self.held.pop(permit)
        limits = None
        if announced is not None:
            limits = RateLimits(requests_limit=announced[0], requests_remaining=announced[1])
        settlement = Settlement("s", TERMS, permit, grant.admitted_at, effect, limits=limits)
        self.run(self.store.settle(settlement))
        if announced is not None:
            self.model.announce(*announced)
        self.model.settle(permit, effect)

    @rule(seconds=st.sampled_from([1.0, 3.0, 10.0, 30.0]))
    def pause(self, seconds: float) -> None:
        self.run(self.store.pause_source("a", seconds))
        self.model.paused_until = max(self.model.paused_until, self.model.now + seconds)

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 5.0, 6.0, 20.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.model.now += seconds

    @invariant()
    def matches_the_model(self) -> None:
        StoreMachine.steps += 1  # once before the first step too: a run's states, not steps
        snapshot = self.run(self.store.snapshot(TERMS))
        model = self.model
        assert snapshot.permits_in_use == len(model.held) <= CAP
        assert snapshot.breaker == model.mode, (snapshot, model)
        assert abs(snapshot.paused_for_s - max(0.0, model.paused_until - model.now)) < 1e-6
        assert snapshot.learned_rpm == model.learned_rpm

    def teardown(self) -> None:
        async def clean() -> None:
            keys = [k async for k in self.store.client.scan_iter(match=self.store.keys.pattern)]
            if keys:
                await self.store.client.delete(*keys)
            await self.store.aclose()

        self.run(clean())
        self.loop.close()


def test_breaker_permits_pauses_and_learned_quotas_follow_the_model(redis_url: str) -> None:
    StoreMachine.redis_url = redis_url
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=RUNS,
            stateful_step_count=STEPS + 20,  # Hypothesis draws each run's length up to this
            derandomize=True,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    print(f"{StoreMachine.runs} runs, {StoreMachine.steps} checked states")
    assert StoreMachine.runs >= RUNS
    assert StoreMachine.steps - StoreMachine.runs >= RUNS * STEPS  # 50 steps a run on average
