"""A release round on a real Redis: what is published goes out in one hand-off and is
confirmed in one script; a broker that cannot be reached ends the round with what went
before it confirmed and the rest still claimed; a publish the broker refuses, or that
fails for the entry's own fault, holds up no other entry."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from amqp.exceptions import MessageNacked
from celery import Celery
from kombu.exceptions import EncodeError

from polygate_celery.celery import parking
from polygate_celery.celery.parking import ParkingLot, Releaser
from polygate_celery.config.models import DeferralConfig
from tests.integration.conftest import PARKED_MESSAGE


async def park(lot: ParkingLot, *entries: str) -> None:
    for entry in entries:
        await lot.park(entry, 0.0, {**PARKED_MESSAGE, "headers": {"id": entry, "task": "t"}}, 60.0)


async def claimed_by(lot: ParkingLot, entry: str) -> str | None:
    token = await lot.client.hget(lot.keys[2], entry)  # (the client decodes replies)
    return None if token is None else str(token)


async def test_a_round_confirms_each_entry_its_releaser_still_holds(lot: ParkingLot) -> None:
    await park(lot, "run-1", "run-2", "run-3")
    assert len(await lot.claim(10, 30.0, "releaser")) == 3
    await lot.client.hset(lot.keys[2], "run-2", "another-releaser")  # its lease ran out
    confirmed = await lot.confirm_all(["run-1", "run-2", "run-3"], "releaser", 0.0)
    assert confirmed == [True, False, True]
    assert await lot.client.zscore(lot.keys[0], "run-1") is None  # forgotten
    assert await lot.client.zscore(lot.keys[0], "run-2") is not None  # not this one's
    assert await claimed_by(lot, "run-2") == "another-releaser"


async def test_an_unreachable_broker_ends_the_round_with_what_went_before_confirmed(
    lot: ParkingLot, monkeypatch: pytest.MonkeyPatch
) -> None:
    await park(lot, "run-1", "run-2", "run-3")
    published: list[str] = []

    def publish(app: Any, message: dict[str, Any], confirm_timeout_s: float) -> None:
        if len(published) == 1:
            raise ConnectionError("the broker is down")
        published.append(message["headers"]["id"])

    monkeypatch.setattr(parking, "publish_message", publish)
    releaser = Releaser(Celery("rounds"), lot, DeferralConfig(), keep=False)
    with pytest.raises(ConnectionError):
        await releaser.release_due()
    (sent,) = published
    assert await claimed_by(lot, sent) is None
    assert await lot.client.zscore(lot.keys[0], sent) is None  # confirmed: forgotten
    rest = {"run-1", "run-2", "run-3"} - {sent}
    for entry in rest:  # the failed one and the one after it: claimed, due at lease end
        assert await claimed_by(lot, entry) == releaser.token
        assert await lot.client.hexists(lot.keys[1], entry)


async def test_a_round_with_nothing_due_publishes_nothing(
    lot: ParkingLot, monkeypatch: pytest.MonkeyPatch
) -> None:
    def publish(*_: Any) -> None:
        raise AssertionError("nothing is due")

    monkeypatch.setattr(parking, "publish_message", publish)
    assert await Releaser(Celery("rounds"), lot, DeferralConfig()).release_due() == 0


def publishing(fail: dict[str, BaseException]) -> tuple[list[str], Any]:
    """A stand-in publish that raises `fail[entry]` for those entries, and the list of
    the entries it published."""
    published: list[str] = []

    def publish(app: Any, message: dict[str, Any], confirm_timeout_s: float) -> None:
        entry = message["headers"]["id"]
        if entry in fail:
            raise fail[entry]
        published.append(entry)

    return published, publish


async def test_a_publish_the_broker_refuses_holds_up_no_other_entry(
    lot: ParkingLot, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await park(lot, "run-1", "run-2", "run-3")
    published, publish = publishing({"run-2": MessageNacked("refused")})
    monkeypatch.setattr(parking, "publish_message", publish)
    releaser = Releaser(Celery("rounds"), lot, DeferralConfig(), keep=False)
    assert await releaser.release_due() == 2  # the round went on
    assert published == ["run-1", "run-3"]
    assert await claimed_by(lot, "run-2") == releaser.token  # due again at lease end
    assert await lot.dead_letters() == {}  # the broker's fault: kept, not buried
    assert [r.levelname for r in caplog.records] == ["WARNING"]  # no ERROR


async def test_a_publish_error_of_the_entry_buries_it_and_the_round_goes_on(
    lot: ParkingLot, monkeypatch: pytest.MonkeyPatch
) -> None:
    await park(lot, "run-1", "run-2", "run-3")
    published, publish = publishing({"run-1": EncodeError("cannot encode")})
    monkeypatch.setattr(parking, "publish_message", publish)
    releaser = Releaser(Celery("rounds"), lot, DeferralConfig(), keep=False)
    assert await releaser.release_due() == 2
    assert published == ["run-2", "run-3"]
    dead = await lot.dead_letters()
    assert list(dead) == ["run-1"]
    assert dead["run-1"].startswith("the publish raised EncodeError\n")


async def test_an_entry_that_keeps_failing_for_no_known_reason_is_buried_after_a_bound(
    lot: ParkingLot, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await park(lot, "run-1")
    published, publish = publishing({"run-1": RuntimeError("odd")})
    monkeypatch.setattr(parking, "publish_message", publish)
    releaser = Releaser(Celery("rounds"), lot, DeferralConfig(), keep=False)
    for release in range(1, parking.MAX_FAILED_RELEASES + 1):
        await park(lot, f"other-{release}")
        await lot.client.zadd(lot.keys[0], {"run-1": 0})  # its lease ended: due again
        assert await releaser.release_due() == 1  # the other one, each round
        assert list(await lot.dead_letters()) == ([] if release < 5 else ["run-1"])
    assert published == [f"other-{n}" for n in range(1, 6)]
    assert await lot.size() == 0
    assert await lot.client.hgetall(lot.keys[1]) == {}  # no count left behind
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "run-1" in error.getMessage()
    assert "RuntimeError" in error.getMessage()
    assert not [r for r in caplog.records if "works again" in r.getMessage()]


async def test_a_published_entry_loses_its_count_of_failed_releases(
    lot: ParkingLot, monkeypatch: pytest.MonkeyPatch
) -> None:
    await park(lot, "run-1")
    fail: dict[str, BaseException] = {"run-1": RuntimeError("odd")}
    _, publish = publishing(fail)
    monkeypatch.setattr(parking, "publish_message", publish)
    releaser = Releaser(Celery("rounds"), lot, DeferralConfig(), keep=True)
    await releaser.release_due()
    assert await lot.client.hget(lot.keys[1], "run-1#failed") == "1"
    fail.clear()
    await lot.client.zadd(lot.keys[0], {"run-1": 0})
    assert await releaser.release_due() == 1
    assert await lot.client.hget(lot.keys[1], "run-1#failed") is None
