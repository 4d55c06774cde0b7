"""Request validation shared by every app's API: strict serializers and one entry point."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.errors import Invalid


class StrictSerializer(serializers.Serializer):
    """Unknown fields are an error, not silently dropped: a typo must not disable a setting."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in sorted(unknown)})
        return super().to_internal_value(data)


class StringField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of quietly turning them into text."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


def validated(serializer_class: type[serializers.Serializer], data: Any, *, partial: bool = False,
              **context: Any) -> dict:
    """The body, validated, or a 400 naming the fields. An empty body is `{}`; a body that is
    not an object is a 400 too."""
    if data is None or data == "":
        data = {}
    if not isinstance(data, dict):
        raise Invalid({"non_field_errors": "The body must be a JSON object."}, "The body must be a JSON object.")
    serializer = serializer_class(data=data, partial=partial, context=context)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
