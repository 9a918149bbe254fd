"""The hash-tag design on a Redis Cluster: one slot per governance group, groups spread.

Governance groups are the connected sets of scopes, sources and quota groups
(polygate_celery/store/redis/groups.py); each script's keys share their
group's tag, and independent scopes get different tags, so different slots.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import key_slot

from polygate_celery import GovernanceBackendError, parse_config
from polygate_celery.config.models import StoreConfig
from polygate_celery.core.terms import SourceTerms
from polygate_celery.governance.plan import source_terms
from polygate_celery.store import AdmitRequest, Grant
from polygate_celery.store.redis import KeySpace, RedisStore, governance_groups
from tests.conftest import unique_prefix
from tests.integration.topology_contract import remove_keys
from tests.redis_topologies import RedisClusterGroup

SOURCE = {"base_url": "http://127.0.0.1:1", "model": "m"}


def config(**scopes: list[str]) -> Any:
    """Scopes over sources named in them; sources `q1`, `q2` share the quota `shared`."""
    names = {name for sources in scopes.values() for name in sources}
    sources = {
        name: {**SOURCE, **({"quota": "shared"} if name in ("q1", "q2") else {})} for name in names
    }
    if "solo" in names:
        sources["solo"]["rpm"] = 60  # a quota of its own
    return parse_config(
        {
            "sources": sources,
            "quotas": {"shared": {"rpm": 100}},
            "scopes": {n: {"kind": "chat", "sources": s} for n, s in scopes.items()},
        }
    )


def slot(name: str) -> int:
    return key_slot(name.encode())


def script_keys(keys: KeySpace, cfg: Any, scope: str) -> list[str]:
    """Every key admit and settle touch for `scope` (all candidates, quotas, gate, progress)."""
    found = [keys.gate(scope), keys.progress(scope)]
    for name in cfg.scopes[scope].sources:
        terms = source_terms(cfg, name)
        quota = terms.quota.name if terms.quota else None
        found += [keys.permits(name), keys.state(name), keys.queue(name), keys.alive(name)]
        found += [keys.quota(quota, name), keys.quota_log(quota, name)]
    return found


def test_each_scope_scripts_sit_in_one_slot_and_independent_scopes_in_different_ones() -> None:
    cfg = config(
        chat=["a", "b"], embed=["c"], bulk=["b", "d"], pooled=["q1"], other=["q2"], lone=["solo"]
    )
    groups = governance_groups(cfg)
    # chat and bulk share b; pooled and other share a quota; embed and lone stand alone.
    assert groups.scopes == {
        "chat": "a",
        "bulk": "a",
        "embed": "c",
        "pooled": "q1",
        "other": "q1",
        "lone": "solo",
    }
    assert groups.quotas == {"shared:shared": "q1", "source:solo": "solo"}
    keys = KeySpace("polygate", groups)
    slots = {scope: {slot(k) for k in script_keys(keys, cfg, scope)} for scope in cfg.scopes}
    assert all(len(s) == 1 for s in slots.values()), slots
    assert slots["chat"] == slots["bulk"]
    assert slots["pooled"] == slots["other"]
    distinct = {next(iter(slots[s])) for s in ("chat", "embed", "pooled", "lone")}
    assert len(distinct) == 4  # four groups, four slots
    assert keys.permits("a").startswith("{polygate/a}:v1:src:a:")


def test_without_groups_the_layout_is_the_single_server_one() -> None:
    """One server and Sentinel keep schema version 1's keys: every key under {prefix}."""
    keys = KeySpace("polygate")
    assert keys.permits("a") == "{polygate}:v1:src:a:permits"
    assert keys.quota("shared:x") == "{polygate}:v1:quota:shared:x"
    assert keys.gate("s") == "{polygate}:v1:scope:s:gate"


def test_the_clean_up_pattern_covers_group_tags_and_no_other_prefix() -> None:
    keys = KeySpace("p", governance_groups(config(s=["a"])))
    pattern = keys.pattern  # Redis's glob reads it as fnmatch does
    for key in (keys.permits("a"), keys.parked("app"), "{p}:v1:x"):
        assert fnmatch.fnmatchcase(key, pattern), key
    for other in ("{p:x}:v1:src:a:permits", "{pp}:v1:x", "{p}:v2:x"):
        assert not fnmatch.fnmatchcase(other, pattern), other


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterGroup]:
    with RedisClusterGroup() as cluster:
        yield cluster


async def test_independent_scopes_run_on_different_shards(cluster: RedisClusterGroup) -> None:
    """Scopes over independent sources, admitted through a store built from the
    configuration: their permits land on more than one master of the real cluster."""
    names = [f"s{i}" for i in range(12)]
    cfg = config(**{f"scope{i}": [n] for i, n in enumerate(names)})
    store = RedisStore.from_config(
        StoreConfig(cluster_nodes=cluster.nodes[:1], key_prefix=unique_prefix()), groups_of=cfg
    )
    try:
        owners = set()
        grants: list[tuple[SourceTerms, str, float]] = []
        for i, name in enumerate(names):
            terms: SourceTerms = source_terms(cfg, name)
            grant = await store.admit(AdmitRequest(f"scope{i}", (terms,), f"p{i}"))
            assert isinstance(grant, Grant)
            owners.add(cluster.owner(slot(store.keys.permits(name))))
            grants.append((terms, grant.permit_id, 30.0))
        assert len(owners) >= 2, "every group landed on one shard"
        # One process's renewal batch holds leases of every group: each still renews.
        assert await store.renew(grants) == [True] * len(names)
        print(f"12 independent scopes: permits on {len(owners)} of 3 masters")
    finally:
        await remove_keys(store)
        await store.aclose()


async def test_a_url_to_a_cluster_node_says_to_use_cluster_nodes(
    cluster: RedisClusterGroup,
) -> None:
    """redis_url names one node of a cluster (whose keys' slot another node serves, or
    with a database other than 0): each call fails closed, and says what to set."""
    node = cluster.ports[0]
    prefix = next(p for p in iter(unique_prefix, "") if cluster.owner(slot(f"{{{p}}}")) != node)
    for url in (f"redis://127.0.0.1:{node}/0", f"redis://127.0.0.1:{node}/1"):
        store = RedisStore.from_url(url, prefix=prefix)
        try:
            with pytest.raises(GovernanceBackendError) as refused:
                await store.admit(AdmitRequest("s", (SourceTerms("a", 1),), "p"))
            assert "set store.cluster_nodes instead of store.redis_url" in str(refused.value)
        finally:
            await store.aclose()  # nothing was written: every call was refused
