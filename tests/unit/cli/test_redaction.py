"""Redis URLs as the command line prints them: the password masked, the rest kept."""

from __future__ import annotations

import pytest

from polygate_celery.cli.redaction import redact_url, redis_address, scrub, url_secrets


@pytest.mark.parametrize(
    ("url", "printed"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:p4ssw0rd@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        (
            "rediss://worker:p4ssw0rd@redis.internal:6380/2",
            "rediss://worker:***@redis.internal:6380/2",
        ),
        ("redis://worker@host/0", "redis://worker@host/0"),  # a user name is not a secret
        ("redis://host/0?password=p4ssw0rd&db=1", "redis://host/0?password=***&db=1"),
        ("redis://:p%40ss@host/0", "redis://:***@host/0"),
        ("unix://:p4ssw0rd@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
        ("redis://:p@ss:w@rd@host:6379", "redis://:***@host:6379"),
    ],
)
def test_the_password_is_masked(url: str, printed: str) -> None:
    assert redact_url(url) == printed


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("redis://:secret@10.0.0.5:6390/0", "10.0.0.5:6390"),
        ("redis://cache", "cache:6379"),
        ("redis://[::1]:7000", "[::1]:7000"),
        ("unix:///run/redis.sock", "/run/redis.sock"),
    ],
)
def test_the_address_is_host_and_port(url: str, address: str) -> None:
    assert redis_address(url) == address


def test_messages_are_scrubbed_of_the_password_as_written_and_decoded() -> None:
    secrets = url_secrets("redis://:p%40ss@host/0")
    assert scrub("auth p@ss failed, p%40ss", *secrets) == "auth *** failed, ***"
    assert url_secrets("redis://host/0") == ()


def test_a_url_that_does_not_parse_is_masked_whole() -> None:
    """An unescaped '#' in the password ends the URL's host part early: where the password
    ends cannot be told, so all but the scheme is masked, and scrubbed from messages."""
    url = "redis://:p4ss#w0rd@redis:6379/0"
    assert redact_url(url) == "redis://***"
    assert scrub(f"cannot reach {url} (p4ss#w0rd)", *url_secrets(url)) == (
        "cannot reach redis://*** (***)"
    )
