"""Edge (CLI): secrets out of everything the command line prints.

API keys are never read back for printing (`SecretStr` keeps them); the one
secret that travels inside a printable value is the password of a Redis URL,
in its user info or its ``password`` query parameter.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"


def _parses(url: str) -> bool:
    """Whether `url` splits as written: a password holding ``#``, ``/`` or ``?`` unescaped
    cuts the URL elsewhere, and where its password ends can no longer be told."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        return False
    return not parts.fragment


def redact_url(url: str) -> str:
    """`url` with its password replaced by ``***`` (the user name stays: it is not secret);
    all of it but the scheme when it does not parse."""
    if not _parses(url):
        scheme, sep, _ = url.partition("://")
        return f"{scheme}://{MASK}" if sep else MASK
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{hostport}" if colon else netloc
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if k.lower() == "password" else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redis_address(url: str) -> str:
    """Where `url` points: ``host:port``, or the socket path of a ``unix://`` URL."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path or "(no socket path)"
    host = parts.hostname or "localhost"
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def scrub(text: str, *secrets: str) -> str:
    """`text` with each non-empty secret replaced by ``***`` (a net under third-party messages)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return text


def url_secrets(url: str) -> tuple[str, ...]:
    """The password `url` carries, as written and decoded (to scrub messages we did not write);
    all of it after the scheme when it does not parse."""
    if not _parses(url):
        rest = url.partition("://")[2] or url
        userinfo = rest.rpartition("@")[0]
        return tuple(s for s in (rest, userinfo, userinfo.partition(":")[2]) if s)
    parts = urlsplit(url)
    found = [v for k, v in parse_qsl(parts.query) if k.lower() == "password"]
    if parts.password:
        found += [parts.password, unquote(parts.password)]
    return tuple(found)
