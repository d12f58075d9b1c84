"""Errors as the API shows them: ``{"error": {"code", "message"}}`` with the right status.

Handlers raise :class:`ApiError` (or a :class:`core.errors.ResontechError`, mapped below); a write
that is stored but not yet visible is :class:`NotYetVisible`, a 202; anything else is a bug, logged
with its traceback and answered with a 500 that names the request id.
"""

from __future__ import annotations

import logging

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from core.errors import (
    AppendRejected,
    AppendTimeout,
    ConcurrencyConflict,
    InvalidInput,
    LogUnavailable,
    NotFound,
    ResontechError,
)
from core.wire import Position
from schemas.api.common import ErrorBody, ErrorDetail

log = logging.getLogger("resontech.gateway")
_ENCODE = msgspec.json.Encoder().encode


class ApiError(ResontechError):
    """An error with its HTTP status, a stable code and a message that says what to fix."""

    code = "api"

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


class NotYetVisible(ResontechError):
    """The log acknowledged an append, but this gateway's projection did not apply it within the
    read-your-writes wait (:data:`gateway.kernel.READ_YOUR_WRITES_S`).

    The change is stored and will be applied: the answer is ``202 Accepted``, never a 5xx that would
    invite a retry (a create route says what it created; any other route answers
    :func:`accepted_response`).

    Attributes:
        projection: the projection that lags.
        position: where the event was stored (``duplicate`` when it was stored before, by a retry's
            first attempt).
    """

    def __init__(self, projection: str, position: Position) -> None:
        super().__init__(
            f"{position.stream} {position.seq} is stored; the {projection} projection has not applied it yet"
        )
        self.projection = projection
        self.position = position


def accepted_response(exc: NotYetVisible) -> Response:
    """202 for a change that is stored but not yet visible here, when the route has nothing better
    to say: ``{"status": "accepted", "stream", "seq", "message"}``."""
    body = {
        "status": "accepted",
        "stream": exc.position.stream,
        "seq": exc.position.seq,
        "message": f"the change is stored ({exc.position.stream} sequence {exc.position.seq}) and will "
        "show shortly; read it back instead of retrying",
    }
    return Response(_ENCODE(body), status_code=202, media_type="application/json")


def not_found(what: str) -> ApiError:
    """404: the resource does not exist *for this caller* (another tenant's resource is not found)."""
    return ApiError(404, "not_found", f"{what} not found")


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def invalid(message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, code, message)


def conflict(message: str) -> ApiError:
    return ApiError(409, "conflict", message)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = _ENCODE(ErrorBody(error=ErrorDetail(code=code, message=message)))
    return Response(body, status_code=status, media_type="application/json", headers=headers)


_MAPPED: tuple[tuple[type[ResontechError], int, str], ...] = (
    (NotFound, 404, "not_found"),
    (InvalidInput, 400, "invalid_request"),
    (ConcurrencyConflict, 409, "conflict"),
    (AppendTimeout, 503, "log_unavailable"),
    (LogUnavailable, 503, "log_unavailable"),
    (AppendRejected, 503, "log_unavailable"),
)


def as_api_error(exc: ResontechError) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    for kind, status, code in _MAPPED:
        if isinstance(exc, kind):
            return ApiError(status, code, str(exc))
    return ApiError(500, "internal", str(exc))


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed here"}
    return error_response(
        exc.status_code,
        codes.get(exc.status_code, "http_error"),
        message.get(exc.status_code, str(exc.detail)),
        dict(exc.headers or {}),
    )


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    request_id = request.scope.get("request_id", "")
    log.exception("unhandled error in %s %s (request %s)", request.method, request.url.path, request_id)
    return error_response(500, "internal", f"internal error; quote request id {request_id} to the operator")


EXCEPTION_HANDLERS = {
    ApiError: handle_api_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
