"""Everything here runs in virtual time: a real sleep fails the test."""

import pytest


@pytest.fixture(autouse=True)
def _virtual_time_only(request: pytest.FixtureRequest) -> None:
    # A test on the Redis store needs a real server, which may have to be started (a
    # private one on a machine without Redis) before time stands still.
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "redis" in callspec.params.values():
        request.getfixturevalue("redis_url")
    request.getfixturevalue("no_real_sleep")
