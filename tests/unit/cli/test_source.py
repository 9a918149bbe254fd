"""`polygate-celery source pause|resume|reset NAME`: fleet-wide, on the configured Redis."""

from __future__ import annotations

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.terms import BreakerTerms, SourceTerms
from polygate_celery.store import AdmitRequest, Grant, Settlement, SourceSnapshot
from polygate_celery.store.redis import RedisStore
from tests.unit.cli.conftest import Cli, Fleet

HOSTED = SourceTerms("hosted", 4, breaker=BreakerTerms(failure_threshold=5))


def snapshot(fleet: Fleet) -> SourceSnapshot:
    async def read(store: RedisStore) -> SourceSnapshot:
        return await store.snapshot(HOSTED)

    return fleet.run(read)


async def break_it(store: RedisStore) -> None:
    """Halve the limit, open the breaker, pause it: everything `reset` forgets."""
    for i in range(5):
        grant = await store.admit(AdmitRequest("summarise", (HOSTED,), f"p{i}"))
        assert isinstance(grant, Grant)
        settlement = Settlement(
            "summarise", HOSTED, f"p{i}", grant.admitted_at, Effect.FAILURE, congested=i == 0
        )
        await store.settle(settlement)
    await store.pause_source("hosted", 600)


def test_pause_then_resume(cli: Cli, fleet: Fleet) -> None:
    ran = cli("source", "pause", "hosted", "90", "--config", fleet.path)
    assert (ran.code, ran.err) == (0, "")
    assert ran.out.startswith("paused hosted fleet-wide; now: breaker closed, limit 4")
    assert snapshot(fleet).paused_for_s == pytest.approx(90, abs=2)

    ran = cli("source", "resume", "hosted", "--config", fleet.path)
    assert ran.code == 0
    assert ran.out.strip().endswith("not paused")
    assert snapshot(fleet).paused_for_s == 0.0


def test_a_shorter_pause_keeps_the_longer_one(cli: Cli, fleet: Fleet) -> None:
    cli("source", "pause", "hosted", "600", "--config", fleet.path)
    cli("source", "pause", "hosted", "5", "--config", fleet.path)
    assert snapshot(fleet).paused_for_s > 590


def test_reset_forgets_breaker_limit_and_pause(cli: Cli, fleet: Fleet) -> None:
    fleet.run(break_it)
    before = snapshot(fleet)
    assert (before.breaker, before.permit_limit, before.paused_for_s > 0) == ("open", 2, True)
    ran = cli("source", "reset", "hosted", "--config", fleet.path)
    assert ran.code == 0
    assert "reset hosted fleet-wide; now: breaker closed, limit 4, 0 in use, not paused" in ran.out
    after = snapshot(fleet)
    assert (after.breaker, after.breaker_failures, after.permit_limit) == ("closed", 0, 4)
    assert after.paused_for_s == 0.0


def test_resume_leaves_the_breaker_open(cli: Cli, fleet: Fleet) -> None:
    fleet.run(break_it)
    cli("source", "resume", "hosted", "--config", fleet.path)
    after = snapshot(fleet)
    assert (after.breaker, after.paused_for_s) == ("open", 0.0)


@pytest.mark.parametrize("seconds", ["0", "-5", "soon", "inf"])
def test_pause_needs_a_positive_number_of_seconds(cli: Cli, fleet: Fleet, seconds: str) -> None:
    line = cli("source", "pause", "hosted", seconds, "--config", fleet.path).error_line
    assert "SECONDS" in line or "seconds" in line


@pytest.mark.parametrize("action", [["pause", "nope", "5"], ["resume", "nope"], ["reset", "nope"]])
def test_an_unknown_source_is_named(cli: Cli, fleet: Fleet, action: list[str]) -> None:
    line = cli("source", *action, "--config", fleet.path).error_line
    assert line == "error: unknown source 'nope' (configured: embedder, hosted, vllm)"
