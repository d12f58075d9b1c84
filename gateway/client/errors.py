"""What the SDK raises: :class:`ApiError` for every refusal, :class:`TransferError` for the object store's."""

from __future__ import annotations

from core.errors import ResontechError


class ApiError(ResontechError):
    """The API refused a request: ``status``, the stable ``code``, a ``message`` that says what to fix.

    Besides the API's own codes: ``unreachable`` (status 0: no connection to the gateway),
    ``http_error`` (an error answer without the API's error body, e.g. from a proxy),
    ``invalid_response`` (an answer that does not decode into the type the API promises) and
    ``accepted`` (status 202: the change is stored but the gateway could not show it yet; read it
    back shortly instead of repeating the request).
    """

    def __init__(self, status: int, code: str, message: str, request_id: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.message} ({self.code}, HTTP {self.status})"


class TransferError(ApiError):
    """The object store refused or dropped an upload or download."""
