"""The private server (`polygate_celery.embedded`) the demo and the tests start."""

from __future__ import annotations

import redis

from polygate_celery.embedded import EmbeddedRedis


def test_a_port_taken_before_the_server_binds_it_moves_the_server_to_another() -> None:
    """A free port is free only when chosen: the server that answers must be this one."""
    with EmbeddedRedis() as first:
        second = EmbeddedRedis()
        second.port = first.port  # another program took it meanwhile
        with second:
            assert second.port != first.port
            assert second.process is not None
            with redis.Redis.from_url(second.url) as client:
                assert int(client.info("server")["process_id"]) == second.process.pid
        assert first.process is not None
        assert first.process.poll() is None  # left alone
