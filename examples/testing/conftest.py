"""The app reads its broker from the environment when imported, as Celery apps do: point
it at a real Redis before the tests import it (a private server when none answers)."""

import os

from polygate_celery.testing.pytest_plugin import redis_for_tests

os.environ.setdefault("SHOP_REDIS_URL", redis_for_tests())
