from __future__ import annotations

import pytest
import redis
from django.conf import settings


@pytest.fixture(autouse=True)
def _fresh_counters():
    """Rate-limit cells are named after keys' prefixes, people's and orgs' ids; a test database
    hands out the same people's ids again on the next run, within the same minute."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in ("undolog:rl:*", "undolog:login:*"):
        keys = list(client.scan_iter(name))
        if keys:
            client.delete(*keys)
    yield
