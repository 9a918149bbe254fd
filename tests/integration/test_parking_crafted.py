"""Crafted parked entries on a real Redis lot, released to a real broker (Redis and
RabbitMQ): each goes to the dead letters once, with one ERROR line naming it and none of
its content, and the good entries of the same round are all released in that round."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Queue
from kombu.exceptions import OperationalError

from polygate_celery.celery.parking import ParkingLot, Releaser
from polygate_celery.config.models import DeferralConfig
from tests.celery.rabbitmq import rabbitmq_vhost  # noqa: F401 - a fixture
from tests.integration.conftest import PARKED_MESSAGE

SECRET = "sk-parked-secret-0123456789"
Message = dict[str, Any]


def good(entry: str, queue: str) -> Message:
    message = copy.deepcopy(PARKED_MESSAGE)
    message["headers"] = {"id": entry, "task": "tests.parked", "argsrepr": f"('{SECRET}',)"}
    message["body"][0] = [SECRET]
    message["routing_key"] = queue
    return message


def _set(**fields: Any) -> Callable[[Message], Message | str]:
    def craft(message: Message) -> Message | str:
        return {**message, **fields}

    return craft


CRAFTED: dict[str, Callable[[Message], Message | str]] = {
    "wrong body shape": _set(body="x"),
    "unknown serializer": _set(serializer="bogus"),
    "unknown compression": _set(compression="bogus"),
    "wrong exchange type": _set(exchange={"name": "", "type": "direct"}),
    "not JSON": lambda message: json.dumps(message)[:-7],
    "exchange that does not exist": _set(exchange="polygate-no-such-exchange"),
}


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest, redis_url: str, fleet_prefix: str) -> Iterator[Any]:
    """An app publishing to the broker, and a queue of the test's own (declared on
    RabbitMQ, where an undeclared queue drops what the default exchange routes to it)."""
    queue = f"{fleet_prefix}-queue"  # on Redis, removed with the prefix's keys
    if request.param == "redis":
        app = Celery(f"crafted-{fleet_prefix}", broker=redis_url)
    else:
        app = Celery(f"crafted-{fleet_prefix}", broker=request.getfixturevalue("rabbitmq_vhost"))
        app.conf.broker_transport_options = {"confirm_publish": True}  # as configure_worker
        with app.connection_for_write() as connection:
            Queue(queue, routing_key=queue, channel=connection.default_channel).declare()
    yield app, queue
    if request.param == "rabbitmq":
        with app.connection_for_write() as connection:
            Queue(queue, channel=connection.default_channel).delete()
    app.close()


def queued_ids(app: Celery, queue: str) -> list[str]:
    """The ids of the task messages in `queue`, in order (taken off it)."""
    ids = []
    with app.connection_for_write() as connection:
        bound = Queue(queue, routing_key=queue, channel=connection.default_channel)
        while (message := bound.get(no_ack=True)) is not None:
            ids.append(message.headers["id"])
    return ids


async def park_round(lot: ParkingLot, queue: str, crafted: Message | str) -> list[str]:
    """Park two good entries, the crafted one ("crafted"), then two more: one round's."""
    goods = ["good-1", "good-2", "good-3", "good-4"]
    for entry in goods[:2]:
        await lot.park(entry, 0.0, good(entry, queue), 60.0)
    await lot.park("crafted", 0.0, good("crafted", queue), 60.0)
    text = crafted if isinstance(crafted, str) else json.dumps(crafted)
    await lot.client.hset(lot.keys[1], "crafted", text)  # written by someone else
    for entry in goods[2:]:
        await lot.park(entry, 0.0, good(entry, queue), 60.0)
    return goods


@pytest.mark.parametrize("case", list(CRAFTED))
async def test_a_crafted_entry_is_dead_lettered_once_and_holds_up_nothing(
    lot: ParkingLot, broker: Any, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    app, queue = broker
    caplog.set_level(logging.INFO, logger="polygate_celery")
    goods = await park_round(lot, queue, CRAFTED[case](good("crafted", queue)))
    releaser = Releaser(app, lot, DeferralConfig(), keep=False)
    assert await releaser.release_due() == len(goods)  # one round: all the good ones
    assert queued_ids(app, queue) == goods
    assert await releaser.release_due() == 0  # nothing left, nothing buried twice
    dead = await lot.dead_letters()
    assert list(dead) == ["crafted"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, caplog.text
    assert "crafted" in errors[0].getMessage()
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []
    assert SECRET not in caplog.text
    assert await lot.size() == 0


async def test_the_release_loop_buries_each_crafted_entry_once_and_fails_no_round(
    lot: ParkingLot, broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every crafted entry at once, among good ones, under the running release loop: one
    ERROR line each, no failed round ("releasing parked tasks failed" / "works again")."""
    app, queue = broker
    caplog.set_level(logging.INFO, logger="polygate_celery")
    goods = []
    for n, (case, craft) in enumerate(CRAFTED.items()):
        goods.append(f"good-{n}")
        await lot.park(goods[-1], 0.0, good(goods[-1], queue), 60.0)
        crafted = craft(good(case, queue))
        await lot.park(case, 0.0, good(case, queue), 60.0)
        text = crafted if isinstance(crafted, str) else json.dumps(crafted)
        await lot.client.hset(lot.keys[1], case, text)
    releaser = Releaser(app, lot, DeferralConfig(), keep=False)
    releaser.start(asyncio.get_running_loop())
    try:
        for _ in range(300):  # the loop's rounds are 0.1-0.2 s apart; a generous 30 s
            if await lot.size() == 0:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # a few more rounds, with nothing due
    finally:
        releaser.stop()
    assert await lot.size() == 0
    assert queued_ids(app, queue) == goods
    assert sorted(await lot.dead_letters()) == sorted(CRAFTED)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == len(CRAFTED), errors
    assert all(any(case in error for error in errors) for case in CRAFTED)
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []
    assert SECRET not in caplog.text


async def test_a_dead_letter_keeps_the_whole_entry(lot: ParkingLot, redis_url: str) -> None:
    """An entry is buried only for its own fault, whole: once mended, it can be parked
    again (the first 4 KB would not do for a task with large arguments)."""
    message = good("crafted", "q")
    message["body"] = ["x" * 10_000, {}, None]  # args not a list
    await lot.park("crafted", 0.0, message, 60.0)
    releaser = Releaser(Celery("whole", broker=redis_url), lot, DeferralConfig(), keep=False)
    assert await releaser.release_due() == 0
    why, entry = (await lot.dead_letters())["crafted"].split("\n", 1)
    assert why == "the task's args must be a list, not str"
    assert json.loads(entry) == message


async def test_a_broker_that_cannot_be_asked_about_a_route_buries_nothing(
    lot: ParkingLot,
) -> None:
    """Where the broker does not answer, an entry's route is no verdict: the round ends,
    the entry stays claimed (due again when its lease ends), nothing is counted against it."""
    message = good("elsewhere", "q")
    message["exchange"] = "an-exchange"  # the default exchange needs no question
    await lot.park("elsewhere", 0.0, message, 60.0)
    app = Celery("down", broker="redis://127.0.0.1:1/0")  # nothing listens there
    releaser = Releaser(app, lot, DeferralConfig(), keep=False)
    with pytest.raises(OperationalError):
        await releaser.release_due()
    assert await lot.dead_letters() == {}
    assert await lot.client.hget(lot.keys[2], "elsewhere") == releaser.token
    assert await lot.client.hget(lot.keys[1], "elsewhere#failed") is None
