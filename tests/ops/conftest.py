from __future__ import annotations

import pytest

from tests.receiver import Receiver


@pytest.fixture
def receiver(acme) -> Receiver:
    """Compensations (signed with the org's secret) and event webhooks (their hook's own) both land here."""
    with Receiver(secrets=None) as r:
        yield r
