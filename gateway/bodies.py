"""Structs made from the structs they show or become, each field carried under its own name.

A response body (``Replica``, ``KeyInfo``, ``EnrollmentRequest``...) mostly repeats a projection
record's fields under the same names, and an event mostly repeats the checked request that asks for
it. :func:`carried` and :func:`converted` take those from the source, so that the code names only
what differs: times as ISO 8601, counts, nested views, renamed or added fields.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

S = TypeVar("S", bound=msgspec.Struct)


def _same_named(target: type[msgspec.Struct], source: object, given: dict[str, Any]) -> dict[str, Any]:
    return {
        name: getattr(source, name)
        for name in target.__struct_fields__
        if name not in given and hasattr(source, name)
    }


def carried(body: type[S], record: object, /, **given: Any) -> S:
    """A ``body`` with the fields ``given``, and every other field taken from ``record``'s attribute
    of the same name (a field ``record`` has no attribute for keeps the body's default)."""
    return body(**_same_named(body, record, given), **given)


def converted(target: type[S], source: object, /, **given: Any) -> S:
    """Like :func:`carried`, with nested values converted to ``target``'s own types (a request's
    ``Resources`` become the event's ``JobResources``) and every value checked against them."""
    return msgspec.convert(msgspec.to_builtins({**_same_named(target, source, given), **given}), target)
