"""bench/undo.py keeps working: a small stack, walked back newest first, numbers reported."""

from __future__ import annotations

import pytest

from bench import undo as bench
from orgs.models import Organization

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_undo_benchmark_walks_a_stack_back_and_reports_its_overhead():
    result = bench.run(entries=20)

    assert result["entries"] == 20 and result["per_second"] > 0
    assert result["per_compensation_ms"] > result["receiver_ms"] > 0
    assert result["overhead_ms"] == pytest.approx(result["per_compensation_ms"] - result["receiver_ms"])
    assert "compensations/s" in bench.report(result, "sqlite")
    assert not Organization.objects.filter(slug__startswith="bench-undo-").exists()  # it cleans up
