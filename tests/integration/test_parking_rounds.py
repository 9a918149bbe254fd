"""A release round on a real Redis: what is published goes out in one hand-off and is
confirmed in one script; a publish that fails ends the round with what went before it
confirmed and the rest still claimed."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from polygate_celery.celery import ParkingLot, parking
from polygate_celery.celery.parking import Releaser
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


async def test_a_publish_that_fails_ends_the_round_with_what_went_before_confirmed(
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
