"""Store layer (Redis): the key layout, versioned and hash-tagged.

Every key starts with the hash tag ``{<prefix>}``, so each script's keys (which
span several sources and their quota groups) sit in one Redis Cluster slot,
then the schema version, so a rolling upgrade to a new layout can run beside
the old one::

    {p}:v1:src:<source>:permits     ZSET    permit id -> lease expiry (store time, s);
                                            "~<call id>": a permit handed to a waiting
                                            call -> the end of its claim
    {p}:v1:src:<source>:queue       ZSET    waiting call -> arrival: the fleet-wide FIFO
                                            a release hands its permit to
    {p}:v1:src:<source>:alive       ZSET    waiting call -> the end of its claim (each
                                            poll renews it: a dead waiter drops out)
    {p}:v1:src:<source>:state       HASH    breaker (mode, failures, open_until, probe),
                                            AIMD (limit, last_decrease), paused_until,
                                            learned quota (lrpm lreq ltpm ltok: the
                                            provider's announced limits, GCRA times)
    {p}:v1:quota:<group>            HASH    bucket (GCRA) times: req (RPM), tok (TPM)
    {p}:v1:quota:<group>:log        ZSET    permit id -> admission time: the RPM sliding
                                            window (at most rpm members, TTL one window)
    {p}:v1:scope:<scope>:progress   STRING  time of the scope's last success, TTL 3,600 s
    {p}:v1:scope:<scope>:gate       HASH    closed after a stalled verdict: until, reset, probe
    {p}:v1:wake:<origin>            channel "<call id> <source>": a permit was handed to
                                            that call of the process `origin`
    {p}:v1:parked:<app>             ZSET    deferred task entry -> due time (the Celery
                                            parking lot, per app; with :msg and :claim)

Permits, pauses, breaker and AIMD state belong to the source (shared by every
scope that uses it); progress belongs to the scope. Memory per source is one
small hash and a sorted set of at most `max_concurrency` members (measured in
`benchmarks/redis_store.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMA_VERSION = 1
_PREFIX = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True, slots=True)
class KeySpace:
    prefix: str = "polygate"

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"invalid key prefix {self.prefix!r}: letters, digits, _ . : - only")

    @property
    def base(self) -> str:
        return f"{{{self.prefix}}}:v{SCHEMA_VERSION}"

    def permits(self, source: str) -> str:
        return f"{self.base}:src:{source}:permits"

    def state(self, source: str) -> str:
        return f"{self.base}:src:{source}:state"

    def queue(self, source: str) -> str:
        return f"{self.base}:src:{source}:queue"

    def alive(self, source: str) -> str:
        return f"{self.base}:src:{source}:alive"

    def quota(self, group: str | None) -> str:
        """The quota group's key; a placeholder (never written) for a source without one."""
        return f"{self.base}:quota:{group}" if group else f"{self.base}:quota:-"

    def quota_log(self, group: str | None) -> str:
        """The quota group's sliding-window log; a placeholder for a source without one."""
        return f"{self.quota(group)}:log"

    def progress(self, scope: str) -> str:
        return f"{self.base}:scope:{scope}:progress"

    def gate(self, scope: str) -> str:
        return f"{self.base}:scope:{scope}:gate"

    def parked(self, app_name: str) -> str:
        """The parking lot of Celery app `app_name` (its ``:msg`` and ``:claim`` keys follow)."""
        return f"{self.base}:parked:{app_name}"

    @property
    def wake(self) -> str:
        """The wake-up channel of a process: this text followed by its origin."""
        return f"{self.base}:wake:"

    @property
    def pattern(self) -> str:
        """Every key of this prefix (for operators and test clean-up)."""
        return f"{self.base}:*"
