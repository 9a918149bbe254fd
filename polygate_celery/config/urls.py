"""Configuration: checking the URLs a configuration names, never quoting them.

A Redis or broker URL may carry a password, so a message about one says what is
wrong with it and never repeats any part of it. A password holding ``#``,
``/``, ``?`` or ``@`` unescaped cuts such a URL somewhere else than its writer
meant (kombu then reads the start of the password as a port and says so): it is
refused here, at load, rather than printed by a library later.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult, urlsplit

import redis
import redis.asyncio
from redis.connection import parse_url

REDIS_SCHEMES = ("redis", "rediss", "unix")
_OTHER_FORMS = {
    "sentinel": "for Redis Sentinel set store.sentinels and store.service_name instead",
    "redis+sentinel": "for Redis Sentinel set store.sentinels and store.service_name instead",
    "redis+cluster": "for Redis Cluster set store.cluster_nodes instead",
    "rediss+cluster": "for Redis Cluster set store.cluster_nodes instead",
}
# Query options that would silently replace what the store sets itself.
_STORE_SETS = {
    "socket_timeout": "set store.socket_timeout_s instead",
    "socket_connect_timeout": "set store.connect_timeout_s instead",
    "retry_on_timeout": "the store never retries (a call fails closed instead)",
    "retry_on_error": "the store never retries (a call fails closed instead)",
    "decode_responses": "the store decodes replies itself",
    "max_connections": "the store sizes its own pool",
    "timeout": "the store waits for a free connection as long as one operation may take",
}
_ESCAPE = "a password holding '#', '/', '?' or '@' must be percent-encoded, e.g. '#' as %23"


def split_url(url: str) -> SplitResult:
    """`url` split as written; ValueError (quoting nothing) when it does not split in one
    way only: a port that is not a number, or a fragment (no server URL has one: a ``#``
    in it belongs to a password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise ValueError(f"the URL does not parse ({_ESCAPE})") from None
    if parts.fragment or url.rstrip().endswith("#"):
        raise ValueError(f"the URL holds a '#' ({_ESCAPE})")
    return parts


def check_redis_url(url: str) -> None:
    """Raise ValueError (never quoting the URL) unless `url` is one redis-py can open:
    ``redis://``, ``rediss://`` (TLS) or ``unix://`` (a socket), with query options a
    connection takes."""
    example = "write redis://[:PASSWORD@]HOST:PORT/DB"
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"the URL has no scheme; {example}")
    if scheme.lower() in _OTHER_FORMS:
        raise ValueError(
            f"scheme {scheme!r} is not a URL the store opens; {_OTHER_FORMS[scheme.lower()]}"
        )
    if scheme.lower() not in REDIS_SCHEMES:
        raise ValueError(
            f"scheme {scheme!r} is not one the store can use (redis://, rediss://, unix://); "
            + example
        )
    try:
        parts = split_url(url)
    except ValueError as exc:
        raise ValueError(f"{exc}; {example}") from None
    if scheme.lower() == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs the socket's path: unix:///path/to/redis.sock")
    elif not parts.hostname:
        raise ValueError(f"the URL has no host; {example}")
    elif parts.path not in ("", "/") and not parts.path.lstrip("/").isdigit():
        raise ValueError(f"the database must be a number (the URL's path); {example}")
    try:
        options = parse_url(url)  # type: ignore[no-untyped-call]  # redis-py reads the query
    except ValueError as exc:
        raise ValueError(f"{exc} ({example})") from None
    _check_query(options)


def _check_query(options: dict[str, Any]) -> None:
    """Refuse a query option a connection would refuse at its first command (so every
    call would fail closed), or one that replaces a setting the store makes itself."""
    for name in sorted(options):
        if name in _STORE_SETS:
            raise ValueError(f"query option {name!r}: {_STORE_SETS[name]}")
    for name in sorted(set(options) - {"connection_class", "host", "port", "path", "db"}):
        if not _connection_takes({**_basics(options), name: options[name]}):
            raise ValueError(
                f"query option {name!r} is unknown to redis-py or has a value it refuses"
            )


def _basics(options: dict[str, Any]) -> dict[str, Any]:
    keep = ("connection_class", "host", "port", "path", "username", "password")
    return {key: options[key] for key in keep if key in options}


def _connection_takes(options: dict[str, Any]) -> bool:
    """Whether both clients the store makes (blocking and asyncio) build a connection from
    `options`: building one opens nothing."""
    for pool_class in (redis.BlockingConnectionPool, redis.asyncio.BlockingConnectionPool):
        kwargs = dict(options)
        sync_class = kwargs.pop("connection_class", None)
        if sync_class is not None:  # parse_url names the blocking classes; asyncio has its own
            module: Any = redis if pool_class is redis.BlockingConnectionPool else redis.asyncio
            kwargs["connection_class"] = getattr(module, sync_class.__name__)
        try:
            pool: Any = pool_class(**kwargs)
            pool.make_connection()
        except Exception:
            return False
    return True


BROKER_EXAMPLE = "e.g. amqp://USER:PASSWORD@HOST:5672// or redis://:PASSWORD@HOST:6379/0"


def check_broker_url(url: str) -> None:
    """Raise ValueError (never quoting the URL) unless each of the ``;``-separated URLs of a
    Celery broker setting splits as written (kombu reads the rest: the transport)."""
    for part in url.split(";"):
        scheme, sep, _ = part.strip().partition("://")
        if not sep or not scheme:
            raise ValueError(f"the URL has no scheme ({BROKER_EXAMPLE})")
        split_url(part.strip())


def check_http_url(url: str) -> None:
    """Raise ValueError (never quoting the URL: it may carry credentials) unless `url` is
    an ``http://`` or ``https://`` URL with a host."""
    example = "e.g. https://api.openai.com/v1 or http://vllm:8000/v1"
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"not a URL: it has no scheme ({example})")
    if scheme.lower() not in ("http", "https"):
        raise ValueError(f"scheme {scheme!r}: only http:// and https:// are called ({example})")
    parts = split_url(url)
    if not parts.hostname:
        raise ValueError(f"the URL has no host ({example})")
    if any(ch.isspace() for ch in url):
        raise ValueError(f"the URL holds white space ({example})")


def origin_of(url: str | None) -> str | None:
    """The origin of an HTTP(S) `url`: ``scheme://host:port`` (the scheme's default port
    when none is written), without its user, password, path, query or fragment, any of
    which may carry a credential (an ``api-key`` query, a token in the path). None for
    no URL or one that does not split."""
    if not url:
        return None
    try:
        parts = split_url(url)
        port = parts.port
    except ValueError:
        return None
    host, scheme = parts.hostname, parts.scheme.lower()
    if not host or scheme not in ("http", "https"):
        return None
    if port is None:
        port = 443 if scheme == "https" else 80
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    return f"{scheme}://{host}:{port}"
