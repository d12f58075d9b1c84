"""Bodies shared by every area: the error body, pages, the caller's identity."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

T = TypeVar("T")


class Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every request body and query: unknown fields are refused."""


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    """What went wrong: a stable machine-readable ``code`` and a message that says what to fix."""

    code: str
    message: str


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every error response: ``{"error": {"code": ..., "message": ...}}``."""

    error: ErrorDetail


class Page(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """One page of a list. ``next`` is an opaque cursor for the following page (absent at the end)."""

    items: list[T]
    next: str | None = None


class PageQuery(Request, frozen=True, kw_only=True):
    """Pagination of a list: at most ``limit`` items after the opaque cursor ``after``."""

    limit: int = 50
    after: str | None = None


class Me(msgspec.Struct, frozen=True, kw_only=True):
    """The caller, as the gateway sees the key it presented."""

    principal: str
    kind: str
    account: str
    role: str
    key_id: str
