"""Edge (CLI): what the commands share: the configuration they read and the store they open.

The configuration comes from ``--config``, else ``$POLYGATE_CONFIG``, else a
``polygate.toml`` in the working directory, with ``POLYGATE_*`` environment
variables on top (as workers load it). The commands that only read or write the
store load it without the sources' API keys (`without_api_keys`): they run where
the keys are not. Commands that act on the fleet open the configured Redis
store, after checking it answers.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

from redis.exceptions import AuthenticationError, RedisError, ResponseError

from polygate_celery.cli.errors import CliError
from polygate_celery.cli.redaction import redis_address, scrub, url_secrets
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.loading import CONFIG_PATH_ENV, load_config
from polygate_celery.config.models import StoreConfig, without_api_keys
from polygate_celery.errors import ConfigError, GovernanceBackendError
from polygate_celery.store.redis import RedisStore
from polygate_celery.store.redis.connect import where as topology_address

DEFAULT_CONFIG_FILE = "polygate.toml"


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"configuration file (default: ${CONFIG_PATH_ENV}, else ./{DEFAULT_CONFIG_FILE})",
    )


def seconds_argument(error: str, *, at_least: float = 0.0) -> Callable[[str], float]:
    """An argument's type: a finite number of seconds above zero and at least `at_least`;
    `error` is what a number out of range is told."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not (math.isfinite(value) and value > 0 and value >= at_least):
            raise argparse.ArgumentTypeError(error)
        return value

    return seconds


def config_file(path: str | None) -> str | None:
    """The file to read: `path`, else ``$POLYGATE_CONFIG``, else ``./polygate.toml`` if
    there is one; None when there is none (the environment alone)."""
    if path:
        return path
    if os.environ.get(CONFIG_PATH_ENV):
        return os.environ[CONFIG_PATH_ENV]
    return DEFAULT_CONFIG_FILE if os.path.isfile(DEFAULT_CONFIG_FILE) else None


def no_configuration(option: str) -> CliError:
    """What to say when no file was given or found, and the environment sets nothing."""
    return CliError(
        f"no configuration: give {option}, set {CONFIG_PATH_ENV}, or run where "
        f"{DEFAULT_CONFIG_FILE} is (there is none in {os.getcwd()})"
    )


def config_error(exc: ConfigError) -> CliError:
    """The one line that says what is wrong with the configuration, by field path."""
    if exc.field == "<file>":
        return CliError(exc.message)
    problems = "; ".join(f"{path}: {message}" for path, message in exc.problems)
    return CliError(f"invalid configuration: {problems}")


def load(path: str | None) -> GatewayConfig:
    """The configuration of `config_file(path)` and the environment, without the sources'
    API keys (the commands that load it this way never call a source)."""
    found = config_file(path)
    try:
        with without_api_keys():
            config = load_config(found)
    except ConfigError as exc:
        raise config_error(exc) from None
    if not config.scopes and not config.sources and found is None:
        raise no_configuration("--config FILE")
    return config


def known(name: str, names: Iterable[str], what: str) -> str:
    """`name`, if it is one of `names`; else the mistake, with the names there are."""
    names = sorted(names)
    if name not in names:
        listed = ", ".join(names) or "none"
        raise CliError(f"unknown {what} {name!r} (configured: {listed})")
    return name


@asynccontextmanager
async def shared_store(config: GatewayConfig, command: str) -> AsyncIterator[RedisStore]:
    """The fleet's Redis store, answering; every Redis failure inside becomes a `CliError`."""
    if not config.store.shared:
        raise CliError(
            f"{command} needs a Redis store (store.redis_url, store.sentinels or "
            "store.cluster_nodes): the in-memory store lives inside one process, so there "
            "is no fleet state to reach"
        )
    where, secrets = store_address(config.store)
    try:
        store = RedisStore.from_config(config.store, groups_of=config)
    except ValueError as exc:
        raise CliError(f"store.redis_url is not a Redis URL: {scrub(str(exc), *secrets)}") from None
    try:
        try:
            await store.client.ping()
        except AuthenticationError:
            held = "store.redis_url" if config.store.redis_url else "store.username/password"
            raise CliError(f"Redis at {where} refused the credentials in {held}") from None
        except ResponseError as exc:
            raise CliError(f"Redis at {where} refused: {scrub(str(exc), *secrets)}") from None
        except (RedisError, OSError) as exc:
            raise CliError(f"cannot reach Redis at {where}: {scrub(str(exc), *secrets)}") from None
        yield store
    except (GovernanceBackendError, RedisError, OSError) as exc:
        raise CliError(f"Redis at {where} failed: {scrub(str(exc), *secrets)}") from None
    finally:
        await store.aclose()


def store_address(config: StoreConfig) -> tuple[str, list[str]]:
    """Where the Redis store is, for messages, and the secrets to scrub from them."""
    secrets = [
        secret.get_secret_value()
        for secret in (config.password, config.sentinel_password)
        if secret is not None
    ]
    if config.redis_url is None:
        return topology_address(config), secrets
    url = config.redis_url.get_secret_value()
    return redis_address(url), [*url_secrets(url), *secrets]
