"""Store layer (Redis): governance groups, the unit of the hash tag on a Redis Cluster.

Each script's keys must sit in one slot. `admit` touches every candidate
source of a scope, their quota groups and the scope's gate; `settle` one
source, its quota group and the scope's progress and gate; a source and a
shared quota serve several scopes. So the smallest unit that keeps every
script in one slot is the *governance group*: the connected set of scopes,
sources and quota groups linked by a scope's source list or a shared quota.
Two scopes with no source or quota in common are in different groups, so
their keys hash to different slots and spread over the cluster's shards.

A group is named after its alphabetically first source, so adding a scope
or a source to a group leaves its name, and its keys, where they were; a
change that joins two groups (a scope over sources of both, a quota shared
across them) moves the keys of the one whose name changes (see keys.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from polygate_celery.config.gateway import GatewayConfig


@dataclass(frozen=True)
class Groups:
    """Name -> group, per kind of name: sources, quota groups (their store names,
    ``shared:<quota>`` or ``source:<source>``) and scopes."""

    sources: dict[str, str] = field(default_factory=dict)
    quotas: dict[str, str] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.sources.items())))


def governance_groups(config: GatewayConfig) -> Groups:
    """The governance groups of `config` (every scope, source and quota group in one)."""
    parent: dict[str, str] = {}

    def find(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def join(nodes: Iterable[str]) -> None:
        roots = sorted({find(n) for n in nodes})
        for root in roots[1:]:
            parent[root] = roots[0]

    for name, source in config.sources.items():
        quota = _quota_name(name, source.quota, source.rpm, source.tpm)
        join([f"src:{name}", *([f"quota:{quota}"] if quota else [])])
    for name, scope in config.scopes.items():
        join([f"scope:{name}", *(f"src:{s}" for s in scope.sources)])
    members: dict[str, list[str]] = {}
    for node in list(parent):
        members.setdefault(find(node), []).append(node)
    label: dict[str, str] = {}
    for root, nodes in members.items():
        sources = sorted(n.removeprefix("src:") for n in nodes if n.startswith("src:"))
        label[root] = sources[0] if sources else min(nodes).partition(":")[2]
    groups = Groups()
    for node in parent:
        kind, _, name = node.partition(":")
        {"src": groups.sources, "quota": groups.quotas, "scope": groups.scopes}[kind][name] = label[
            find(node)
        ]
    return groups


def _quota_name(source: str, shared: str | None, rpm: int | None, tpm: int | None) -> str:
    """The store's name of a source's quota group (as `governance.plan.source_terms`)."""
    if shared is not None:
        return f"shared:{shared}"
    if rpm is not None or tpm is not None:
        return f"source:{source}"
    return ""
