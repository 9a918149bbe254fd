"""Store layer (Redis): the key layout, versioned and hash-tagged.

Every key starts with a hash tag, then the schema version (so a rolling
upgrade to a new layout can run beside the old one). Each script's keys share
one tag, so each script runs in one Redis Cluster slot:

- the *fleet tag* ``{<prefix>}``: every key on one server or behind Sentinel,
  and on a cluster the keys that belong to no governance group (the Celery
  run markers, paid results and parking lots, whose scripts span a worker's
  runs, and the keys of names no configuration grouped);
- on a Redis Cluster, a *group tag* ``{<prefix>/<group>}`` per governance
  group (`groups`: the connected set of scopes, sources and quota groups,
  named after its first source) for the source, quota and scope keys, so
  independent scopes land on different slots and spread over the shards. A
  prefix never holds ``/``, so no group tag is another prefix's fleet tag.

On one server the layout is the one schema version 1 always had; the group
tags are used only when the store is built for a cluster (`store_from_config`),
which earlier versions did not support, so no rolling upgrade meets both.
A configuration change that joins two groups on a cluster moves the renamed
group's keys: its state starts afresh, and workers on the old and the new
configuration side by side each hold the cap on their own keys until the old
ones stop. Keys (``{t}``: the key's tag, ``{p}``: the fleet tag)::

    {t}:v1:src:<source>:permits     ZSET    permit id -> lease expiry (store time, s);
                                            "~<call id>": a permit handed to a waiting
                                            call -> the end of its claim
    {t}:v1:src:<source>:queue       ZSET    waiting call -> arrival: the fleet-wide FIFO
                                            a release hands its permit to
    {t}:v1:src:<source>:alive       ZSET    waiting call -> the end of its claim (each
                                            poll renews it: a dead waiter drops out)
    {t}:v1:src:<source>:state       HASH    breaker (mode, failures, open_until, probe,
                                            opened_at), AIMD (limit, last_decrease),
                                            paused_until, error (the last failure's or
                                            pause's classified error, for log lines),
                                            learned quota (lrpm lreq ltpm ltok: the
                                            provider's announced limits, GCRA times;
                                            lwend lwleft lwseen: its requests window)
    {t}:v1:src:<source>:tenant:<tenant>:permits  ZSET  a tenant with caps (SPEC §8): the
                                            permits its calls were granted there -> their
                                            admission time (those the source's permits no
                                            longer hold, or hold expired, are dropped when
                                            they would count); TTL TENANT_KEPT_S
    {t}:v1:src:<source>:tenant:<tenant>:rate  HASH  its buckets there (GCRA times): req
                                            (rpm), tok (tpm); TTL until they refill
    {t}:v1:quota:<group>            HASH    bucket (GCRA) times: req (RPM), tok (TPM)
    {t}:v1:quota:<group>:log        ZSET    permit id -> admission time: the RPM sliding
                                            window (at most rpm members, TTL one window)
    {t}:v1:scope:<scope>:progress   STRING  time of the scope's last success, TTL 3,600 s
    {t}:v1:scope:<scope>:gate       HASH    closed after a stalled verdict: until, reset, probe,
                                            error; kept a minute after it opens (the
                                            stall's record), deleted by a success
    {p}:v1:wake:<origin>            channel "<call id> <source>": a permit was handed to
                                            that call of the process `origin` (a
                                            cluster broadcasts a PUBLISH to every node)
    {p}:v1:parked:<app>             ZSET    deferred task entry -> due time (the Celery
                                            parking lot, per app; with :msg and :claim)
    {p}:v1:parked:<app>:scope:<scope>  ZSET  the entries an outage of the scope parked
                                            (woken when it answers again; :probe marks
                                            a probe woken lately)

Permits, pauses, breaker and AIMD state belong to the source (shared by every
scope that uses it); progress belongs to the scope. Memory per source is one
small hash and a sorted set of at most `max_concurrency` members (measured in
`benchmarks/redis_store.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from polygate_celery.store.redis.groups import Groups

SCHEMA_VERSION = 1
_PREFIX = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True, slots=True)
class KeySpace:
    prefix: str = "polygate"
    groups: Groups = field(default_factory=Groups)

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"invalid key prefix {self.prefix!r}: letters, digits, _ . : - only")

    @property
    def base(self) -> str:
        """The fleet tag and version: the start of every key outside a group."""
        return f"{{{self.prefix}}}:v{SCHEMA_VERSION}"

    def _in(self, group: str | None) -> str:
        return self.base if group is None else f"{{{self.prefix}/{group}}}:v{SCHEMA_VERSION}"

    def permits(self, source: str) -> str:
        return f"{self._in(self.groups.sources.get(source))}:src:{source}:permits"

    def state(self, source: str) -> str:
        return f"{self._in(self.groups.sources.get(source))}:src:{source}:state"

    def queue(self, source: str) -> str:
        return f"{self._in(self.groups.sources.get(source))}:src:{source}:queue"

    def alive(self, source: str) -> str:
        return f"{self._in(self.groups.sources.get(source))}:src:{source}:alive"

    def tenant_permits(self, source: str, tenant: str) -> str:
        return f"{self._in(self.groups.sources.get(source))}:src:{source}:tenant:{tenant}:permits"

    def tenant_rate(self, source: str, tenant: str) -> str:
        return f"{self._in(self.groups.sources.get(source))}:src:{source}:tenant:{tenant}:rate"

    def quota(self, group: str | None, source: str = "") -> str:
        """The quota group's key; a placeholder (never written) for a source without one,
        in the tag of `source` (the script's other keys)."""
        if not group:
            return f"{self._in(self.groups.sources.get(source))}:quota:-"
        return f"{self._in(self.groups.quotas.get(group))}:quota:{group}"

    def quota_log(self, group: str | None, source: str = "") -> str:
        """The quota group's sliding-window log; a placeholder for a source without one."""
        return f"{self.quota(group, source)}:log"

    def progress(self, scope: str) -> str:
        return f"{self._in(self.groups.scopes.get(scope))}:scope:{scope}:progress"

    def class_progress(self, scope: str) -> str:
        return f"{self._in(self.groups.scopes.get(scope))}:scope:{scope}:class_progress"

    def gate(self, scope: str) -> str:
        return f"{self._in(self.groups.scopes.get(scope))}:scope:{scope}:gate"

    def parked(self, app_name: str) -> str:
        """The parking lot of Celery app `app_name` (its ``:msg`` and ``:claim`` keys follow)."""
        return f"{self.base}:parked:{app_name}"

    @property
    def wake(self) -> str:
        """The wake-up channel of a process: this text followed by its origin."""
        return f"{self.base}:wake:"

    @property
    def pattern(self) -> str:
        """Every key of this prefix, fleet and group tags alike (for operators and test
        clean-up): ``{p}:v1:*`` and ``{p/<group>}:v1:*``."""
        return f"{{{self.prefix}[}}/]*:v{SCHEMA_VERSION}:*"
