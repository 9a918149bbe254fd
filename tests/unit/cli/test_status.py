"""`polygate-celery status`: the fleet's state read from a real Redis, once or every N seconds."""

from __future__ import annotations

import re

import pytest

from polygate_celery.cli import status
from polygate_celery.cli.redaction import redis_address
from polygate_celery.core.breaker import Effect
from polygate_celery.core.outcome import RateLimits
from polygate_celery.core.standing import PLAIN, Standing, TenantCaps, named_for
from polygate_celery.core.terms import QuotaTerms, SourceTerms
from polygate_celery.store import AdmitRequest, Grant, Settlement
from polygate_celery.store.redis import RedisStore
from tests.unit.cli.conftest import Cli, Fleet

VLLM = SourceTerms("vllm", 8)


async def busy_fleet(store: RedisStore) -> None:
    """Two permits held at vllm and a halved limit, hosted's breaker open, embed gated."""
    for permit in ("held-1", "held-2"):
        await store.admit(AdmitRequest("summarise", (VLLM,), permit))
    grant = await store.admit(AdmitRequest("summarise", (VLLM,), "congested"))
    assert isinstance(grant, Grant)
    await store.settle(
        Settlement("summarise", VLLM, "congested", grant.admitted_at, Effect.NEUTRAL, True)
    )
    hosted = SourceTerms("hosted", 4)
    for i in range(5):
        grant = await store.admit(AdmitRequest("summarise", (hosted,), f"failing-{i}"))
        assert isinstance(grant, Grant)
        await store.settle(
            Settlement("summarise", hosted, f"failing-{i}", grant.admitted_at, Effect.FAILURE)
        )
    await store.pause_source("embedder", 600)
    await store.close_gate("embed", 900)
    await store.mark_progress("summarise")


def row(out: str, *first: str) -> list[str]:
    """The cells of the table row that starts with `first`."""
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[: len(first)] == list(first):
            return cells
    raise AssertionError(f"no row {first} in:\n{out}")


def seconds(shown: str) -> int:
    """A duration as status prints it ("14m59s") in seconds."""
    found = re.fullmatch(r"(\d+)m(\d\d)s", shown)
    assert found is not None, shown
    return int(found[1]) * 60 + int(found[2])


def test_status_shows_each_scope_and_its_sources(cli: Cli, fleet: Fleet) -> None:
    fleet.run(busy_fleet)
    ran = cli("status", "--config", fleet.path)
    assert (ran.code, ran.err) == (0, "")
    out = ran.out
    assert f"redis {redis_address(fleet.url)}  prefix {fleet.prefix}" in out
    assert row(out, "summarise", "chat")[2].endswith("s ago")
    embed = row(out, "embed", "embedding")
    assert embed[2] == "none in 1h"
    assert embed[3].startswith("closed "), embed
    assert 870 < seconds(embed[3].removeprefix("closed ")) <= 900, embed
    # IN USE, LIMIT (AIMD), CAP, BREAKER, FAILS, PAUSED, QUOTA
    assert row(out, "summarise", "vllm")[2:8] == ["2", "4", "8", "closed", "0", "-"]
    hosted = row(out, "hosted")
    assert hosted[1:7] == ["0", "4", "4", "open", "5", "-"]
    assert re.fullmatch(r"rpm \d/90 \d+% \(provider\)", hosted[7]), hosted
    embedder = row(out, "embed", "embedder")
    assert 570 < seconds(embedder[7]) <= 600, embedder  # a slow machine reads it later
    assert embedder[8] == "rpm 0/600 0%, tpm 0/100k 0%"
    assert "parked tasks: none" in out


def test_quota_use_is_what_the_minute_has_spent(cli: Cli, fleet: Fleet) -> None:
    async def spend(store: RedisStore) -> None:
        terms = SourceTerms("embedder", 8, quota=QuotaTerms("source:embedder", 600, 100_000))
        for i in range(6):
            await store.admit(AdmitRequest("embed", (terms,), f"e{i}", est_tokens=5000))

    fleet.run(spend)
    quota = row(cli("status", "--config", fleet.path).out, "embed", "embedder")[8]
    found = re.fullmatch(r"rpm (\d)/600 \d%, tpm ([\d.]+)k/100k (\d+)%", quota)
    assert found is not None, quota
    assert 0 <= int(found[1]) <= 6  # 600 rpm refills ten a second
    assert 25 <= float(found[2]) <= 30  # 30k tokens reserved, refilling 1.7k a second
    assert 25 <= int(found[3]) <= 30


def test_status_shows_the_limits_a_provider_announced(cli: Cli, fleet: Fleet) -> None:
    async def announce(store: RedisStore) -> None:
        grant = await store.admit(AdmitRequest("summarise", (VLLM,), "answered"))
        assert isinstance(grant, Grant)
        limits = RateLimits(requests_limit=120, requests_remaining=100, tokens_limit=40_000)
        settled = Settlement(
            "summarise", VLLM, "answered", grant.admitted_at, Effect.SUCCESS, limits=limits
        )
        await store.settle(settled)

    fleet.run(announce)
    out = cli("status", "--config", fleet.path).out
    assert row(out, "summarise", "vllm")[8] == "announced 120 rpm"  # tokens: no remaining


def test_the_parked_backlog_counts_entries_those_due_and_dead_letters(
    cli: Cli, fleet: Fleet
) -> None:
    async def park(store: RedisStore) -> None:
        now = float((await store.client.time())[0])
        due = {f"task-{i}:s:1:0": now - 10 for i in range(3)}
        later = {f"task-{i}:s:1:0": now + 600 for i in range(3, 8)}
        await store.client.zadd(store.keys.parked("tasks@b1"), {**due, **later})
        await store.client.hset(store.keys.parked("tasks@b1") + ":dead", "bad", "not JSON\n{")
        await store.client.zadd(store.keys.parked("other.app@b2"), {"x:s:1:0": now + 60})
        # An outage's entries are indexed by scope too, and a woken probe leaves a marker:
        # both belong to their lot, not lots of their own.
        index = store.keys.parked("tasks@b1") + ":scope:summarise"
        await store.client.zadd(index, {f"task-{i}:s:1:0": now + 600 for i in range(3, 8)})
        await store.client.set(f"{index}:probe", "1", ex=60)

    fleet.run(park)
    out = cli("status", "--config", fleet.path).out
    assert row(out, "tasks@b1") == ["tasks@b1", "8", "3", "1"]
    assert row(out, "other.app@b2") == ["other.app@b2", "1", "0", "0"]
    only = cli("status", "--config", fleet.path, "--app", "tasks").out
    assert "other.app" not in only
    assert row(only, "tasks@b1") == ["tasks@b1", "8", "3", "1"]
    assert "parked tasks: none" in cli("status", "--config", fleet.path, "--app", "idle").out


def test_scope_narrows_the_view(cli: Cli, fleet: Fleet) -> None:
    out = cli("status", "--config", fleet.path, "--scope", "embed").out
    assert "embedder" in out
    assert "summarise" not in out
    assert "vllm" not in out


def test_the_config_path_may_come_from_the_environment(
    cli: Cli, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYGATE_CONFIG", fleet.path)
    assert "summarise" in cli("status").out


def test_watch_redraws_until_ctrl_c_and_exits_0(
    cli: Cli, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status, "sleep", sleep)
    ran = cli("status", "--config", fleet.path, "--watch")
    assert (ran.code, ran.err) == (0, "")
    assert pauses == [2.0, 2.0]
    assert ran.out.count("SCOPE      KIND") == 2
    assert ran.out.count("every 2s, Ctrl-C to stop") == 2
    assert "\x1b[" not in ran.out  # not a terminal: frames one after another

    pauses.clear()
    assert cli("status", "--config", fleet.path, "--watch", "0.5").code == 0
    assert pauses == [0.5, 0.5]


async def classes_waiting(store: RedisStore) -> None:
    """vllm full (a cap of 8 held); two interactive and three batch calls waiting."""
    for i in range(8):
        await store.admit(AdmitRequest("summarise", (VLLM,), f"held-{i}"))
    floors = (0.0, 0.1)
    for name, rank in (("i0", 0), ("i1", 0), ("b0", 1), ("b1", 1), ("b2", 1)):
        request = AdmitRequest(
            "summarise",
            (VLLM,),
            f"ask-{name}",
            call_id=name,
            claim_s=60.0,
            standing=Standing(rank=rank, floors=floors),
        )
        await store.admit(request)


def test_status_shows_the_calls_waiting_in_each_class(cli: Cli, fleet: Fleet) -> None:
    classes = "\n[priorities.interactive]\n\n[priorities.batch]\nmin_share = 0.1\n"
    with open(fleet.path, "a", encoding="utf-8") as config:
        config.write(classes)
    fleet.run(classes_waiting)
    ran = cli("status", "--config", fleet.path)
    assert (ran.code, ran.err) == (0, "")
    assert row(ran.out, "vllm", "interactive") == ["vllm", "interactive", "2", "0", "-"]
    assert row(ran.out, "batch")[:3] == ["batch", "3", "0"]  # waiting; none booked a slot


def test_status_shows_no_classes_where_none_are_declared(cli: Cli, fleet: Fleet) -> None:
    ran = cli("status", "--config", fleet.path)
    assert "CLASS" not in ran.out


async def tenants_busy(store: RedisStore) -> None:
    """vllm full: acme holds 3 of its permits, beta 5; two of acme's calls wait, one of beta's."""
    caps = TenantCaps(max_concurrency=3)
    for i in range(8):
        tenant, standing = (
            ("acme", Standing(tenant="acme", caps=caps)) if i < 3 else ("beta", PLAIN)
        )
        request = AdmitRequest(
            "summarise", (VLLM,), named_for(f"held-{i}", tenant), standing=standing
        )
        assert isinstance(await store.admit(request), Grant)
    for name, tenant in (("w0", "acme"), ("w1", "acme"), ("w2", "beta")):
        call = named_for(name, tenant)
        await store.admit(
            AdmitRequest("summarise", (VLLM,), f"ask-{name}", call_id=call, claim_s=60.0)
        )


def test_status_shows_each_tenants_calls_and_its_cap(cli: Cli, fleet: Fleet) -> None:
    with open(fleet.path, "a", encoding="utf-8") as config:
        config.write("\n[tenants.acme]\nmax_concurrency = 3\n")
    fleet.run(tenants_busy)
    ran = cli("status", "--config", fleet.path)
    assert (ran.code, ran.err) == (0, "")
    assert row(ran.out, "vllm", "beta") == ["vllm", "beta", "5", "1", "0"]  # the busiest first
    assert row(ran.out, "acme") == ["acme", "3/3", "2", "0"]


def test_status_shows_no_tenants_where_no_call_names_one(cli: Cli, fleet: Fleet) -> None:
    fleet.run(busy_fleet)
    ran = cli("status", "--config", fleet.path)
    assert "TENANT" not in ran.out
