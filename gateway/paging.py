"""Opaque pagination cursors: what a list's ``next`` holds and its ``?after=`` takes back.

A cursor is the position after the last item of a page (a sequence or an id), tagged with the list
it belongs to and base64url-encoded, so clients treat it as opaque and a cursor of one list is
refused by another. A cursor the API did not give out is a 400 that says to start again.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from typing import TypeVar

from gateway.errors import ApiError

R = TypeVar("R")


def encode_cursor(scope: str, position: int | str) -> str:
    """The cursor of ``position`` in the list named ``scope``."""
    return base64.urlsafe_b64encode(f"{scope}:{position}".encode()).decode().rstrip("=")


def _bad(cursor: str) -> ApiError:
    shown = cursor if len(cursor) <= 40 else cursor[:40] + "..."
    return ApiError(
        400,
        "invalid_cursor",
        f"the cursor {shown!r} is not one this list gave out; pass a 'next' value from a previous "
        "page as ?after=, or leave it out to start from the beginning",
    )


def decode_cursor(scope: str, cursor: str) -> str:
    """The position in a cursor of list ``scope``; 400 ``invalid_cursor`` for anything else."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise _bad(cursor) from None
    found, sep, position = text.partition(":")
    if not sep or found != scope or not position:
        raise _bad(cursor)
    return position


def decode_seq_cursor(scope: str, cursor: str | None) -> int:
    """The sequence in a cursor of list ``scope`` (0 without a cursor); 400 for a bad one."""
    if cursor is None:
        return 0
    position = decode_cursor(scope, cursor)
    if not position.isdigit() or len(position) > 19:
        raise _bad(cursor)
    return int(position)


def newest_first(
    scope: str, records: Iterable[R], seq: Callable[[R], int], cursor: str | None, limit: int
) -> tuple[list[R], str | None]:
    """One page of ``records``, newest (highest ``seq``) first, after the cursor of list ``scope``
    (from the start without one), and the cursor of the next page (``None`` on the last)."""
    before = decode_seq_cursor(scope, cursor) if cursor is not None else None
    found = [r for r in records if before is None or seq(r) < before]
    found.sort(key=seq, reverse=True)
    page = found[:limit]
    return page, encode_cursor(scope, seq(page[-1])) if len(found) > limit else None
