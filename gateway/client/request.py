"""One HTTP call to the API, described as data (:class:`_Req`): what to send, whether it may be sent
twice, how its answer becomes a typed value, and how a refusal, an unreachable gateway or an
undecodable answer becomes an :class:`~gateway.client.errors.ApiError`. Sending, to one gateway after
another (:mod:`gateway.client.gateways`), is the clients' own (sync or asyncio)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
import msgspec

from gateway.client.errors import ApiError
from gateway.client.gateways import Attempts, replayable
from schemas.api.common import ErrorBody

T = TypeVar("T")

_ENCODE = msgspec.json.Encoder().encode
_ERROR_BODY = msgspec.json.Decoder(ErrorBody).decode


class _Accepted(msgspec.Struct, frozen=True):
    """The body of a 202 that has no resource to show (``gateway.errors.accepted_response``)."""

    message: str


_ACCEPTED = msgspec.json.Decoder(_Accepted).decode


def _no_body(content: bytes) -> None:
    """The decoder of calls answered without a body (204)."""
    return None


@dataclass(frozen=True)
class _Req(Generic[T]):
    """One HTTP call to the API: what to send, and ``decode``, how its answer becomes a ``T``.

    ``body`` is a request Struct or a mapping of its fields (a spec file's content), sent as JSON.
    ``replayable`` says whether the call may be sent again after it may have reached a gateway;
    ``None``: as its method and ``Idempotency-Key`` say (:func:`~gateway.client.gateways.replayable`).
    """

    method: str
    path: str
    decode: Callable[[bytes], T]
    body: msgspec.Struct | Mapping[str, object] | None = None
    params: Mapping[str, str | int] | None = None
    headers: Mapping[str, str] | None = None
    replayable: bool | None = None

    @property
    def may_replay(self) -> bool:
        """True when sending it again after a lost answer stores nothing twice."""
        return replayable(self.method, self.headers) if self.replayable is None else self.replayable

    def request(self, http: httpx.Client | httpx.AsyncClient, base: str) -> httpx.Request:
        """The request to the gateway at ``base`` (its URL, e.g. ``http://127.0.0.1:8080``)."""
        headers = dict(self.headers or {})
        content = None
        if self.body is not None:
            content = _ENCODE(self.body)
            headers["Content-Type"] = "application/json"
        return http.build_request(
            self.method, base + self.path, content=content, params=self.params, headers=headers
        )

    def answer(self, response: httpx.Response) -> T:
        """The answer decoded into ``T``, or the API's refusal raised as :class:`ApiError`."""
        if response.status_code >= 400:
            raise _error(response)
        try:
            return self.decode(response.content)
        except msgspec.DecodeError as exc:  # msgspec.ValidationError too: the right JSON, wrong shape
            raise _undecodable(f"{self.method} {self.path}", response, exc) from None


def _undecodable(call: str, response: httpx.Response, exc: msgspec.DecodeError) -> ApiError:
    request_id = response.headers.get("x-request-id", "")
    if response.status_code == 202:  # stored, not yet visible, and no resource to show for it
        with contextlib.suppress(msgspec.DecodeError):
            return ApiError(202, "accepted", _ACCEPTED(response.content).message, request_id)
    message = f"the gateway's answer to {call} is not what the API promises: {exc}"
    return ApiError(response.status_code, "invalid_response", message, request_id)


def _error(response: httpx.Response) -> ApiError:
    request_id = response.headers.get("x-request-id", "")
    try:
        detail = _ERROR_BODY(response.content).error
    except msgspec.DecodeError:
        text = (
            response.text.strip().splitlines()[0][:200] if response.text.strip() else response.reason_phrase
        )
        return ApiError(response.status_code, "http_error", text, request_id)
    return ApiError(response.status_code, detail.code, detail.message, request_id)


def _unreachable(attempts: Attempts, req: _Req[Any], exc: httpx.TransportError) -> ApiError:
    message = attempts.unreachable_message(req.method, req.path, exc, req.may_replay)
    return ApiError(0, "unreachable", message)


def _params(**values: str | int | None) -> dict[str, str | int]:
    return {k: v for k, v in values.items() if v is not None}


def _spec(spec: Mapping[str, object] | msgspec.Struct) -> Mapping[str, object] | msgspec.Struct:
    """A spec as given: a request Struct, or a mapping of its fields (copied: msgspec encodes dicts)."""
    return spec if isinstance(spec, msgspec.Struct) else dict(spec)
