"""core: the one backoff every retried call uses, and the typed shapes the schema reads."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from rest_framework import serializers

from core.retry import backoff_s
from core.schema import shape


def test_it_doubles_the_ceiling_per_attempt_and_caps_it():
    assert [backoff_s(n, 1.5, 10, spread=0) for n in (1, 2, 3, 4, 5)] == [1.5, 3, 6, 10, 10]


def test_it_draws_deliveries_from_the_upper_half_and_undo_attempts_from_zero():
    halves = [backoff_s(3, 1, 3600, spread=0.5) for _ in range(500)]
    fulls = [backoff_s(3, 1, 3600) for _ in range(500)]

    assert min(halves) >= 2 and max(halves) <= 4
    assert min(fulls) < 0.2 and max(fulls) <= 4


class InnerDict(TypedDict):
    n: int


class OuterDict(TypedDict):
    """An outer body."""

    name: str
    maybe: str | None
    items: list[InnerDict]
    extra: NotRequired[dict[str, Any]]


def test_it_turns_a_typed_dict_into_the_serializer_the_schema_reads():
    fields = shape(OuterDict)().fields

    assert shape(OuterDict).__name__ == "Outer"  # the component's name
    assert isinstance(fields["name"], serializers.CharField) and fields["name"].required
    assert fields["maybe"].allow_null
    assert isinstance(fields["items"], serializers.ListField)
    assert isinstance(fields["items"].child, serializers.Serializer)
    assert not fields["extra"].required
