"""OpenAI-compatible inference routes: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/models``.

These are not :class:`gateway.api.Router` operations, on purpose: OpenAI's clients expect OpenAI's
error body, ``{"error": {"message", "type", "param", "code"}}``, where the rest of the API answers
``{"error": {"code", "message"}}``; and a response here is the replica's own bytes (SSE streams
included) passed through, never re-encoded. They are also not in the OpenAPI document (OpenAI's
own specification describes them).

Tokens are metered here (:mod:`gateway.token_counts`, :mod:`gateway.token_meter`): the ``usage`` of every
response is counted for the replica that served it, bounded by the request's bytes and ``max_tokens``
and by the answer's bytes (a replica's count is its provider's word). A streaming request is sent with
``stream_options.include_usage`` (its only change), and the usage chunk that asks for is not passed
on unless the client asked for it too.

``model`` names an endpoint of the caller's tenant (by name, or by endpoint id); another tenant's
endpoint is as unknown as one that does not exist: 404 ``model_not_found``. A key is a tenant key of
any role (the operator and provider accounts have no endpoints to call); it stays here: a replica is
sent only ``accept`` and ``content-type`` of the request's headers, and its own key
(:mod:`gateway.inference`). A malformed body (not JSON, no ``model``, nested beyond msgspec's depth
limit) is a 400 and is not forwarded; a body over
``RESONTECH_GATEWAY_MAX_INFERENCE_BODY_BYTES`` (16 MiB by default: prompts and embedding inputs
outgrow the API's 1 MiB) is a 413, refused on its declared ``Content-Length`` before a byte of it
is read, or as soon as a chunked body passes the limit.

Admission (:func:`take_slot`): a request takes a slot on a ready replica (at most the endpoint's
``max_concurrency`` each), chosen by the endpoint's ``routing`` (:mod:`gateway.routing`: the
``x-session-id`` header or the body's ``user``, or the prompt's leading text, are read for it), or
waits in the endpoint's line (:mod:`gateway.queueing`: fair across the tenant's API keys). A
request that finds no ready replica waits in the same line (a replica starting, or a scale-up from
zero that it asks for). The line full (``max_queue``), or a wait past ``queue_timeout_s``, is a 429
``rate_limit_exceeded`` with ``Retry-After`` (never a hang, never a 5xx for load); a client that
hangs up leaves the line; an endpoint that failed (its replicas kept failing to start) is a 503
``endpoint_failed`` with the reason, at once. The slot is released when the answer ends, on every
path (a stream's end, an error, a client gone: :class:`ReleasingStream`), and goes to the next in
line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from core.clock import NS_PER_S
from core.errors import ResontechError
from gateway.api import TOO_DEEP, read_body
from gateway.auth import Principal, authenticate, bearer
from gateway.autoscaler import wake
from gateway.errors import ApiError
from gateway.inference import InferenceProxy, NoReplica, Upstream, UpstreamError
from gateway.kernel import Kernel
from gateway.queueing import Line, LineFull, Waiter
from gateway.routing import RoutedBody, route_key
from gateway.token_counts import SseUsage, ask_for_usage, bound_of, tokens_of
from gateway.token_meter import TokenMeter
from projections import ENDPOINTS
from projections.endpoints import EndpointRecord, ReplicaRecord, endpoint_key, ready_replicas

log = logging.getLogger("resontech.gateway")
COLD_START_REPORT_S = 0.05
COLD_START_HEADER = "x-resontech-cold-start-s"
"""Seconds a request waited for a replica slot: in line, for a scale-up from zero or a replica starting."""
REPLICA_HEADER = "x-resontech-replica"
"""Names the replica slot that served a response (for debugging and the routing tests)."""
_WAIT_STEP_S = 0.1
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "requests",
    502: "api_error",
    503: "service_unavailable",
}
_FORWARD_HEADERS = ("accept", "content-type")


class OpenAIError(ResontechError):
    """An error in OpenAI's shape (``headers``: extra response headers, e.g. ``Retry-After``)."""

    code = "openai"

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = headers or {}


class ClientGone(ResontechError):
    """The client hung up while its request waited in line."""

    code = "client_gone"


def error_response(exc: OpenAIError) -> Response:
    body = {
        "error": {
            "message": exc.message,
            "type": _ERROR_TYPES.get(exc.status, "api_error"),
            "param": exc.param,
            "code": exc.code,
        }
    }
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


_DECODE = msgspec.json.Decoder(RoutedBody).decode


def caller(request: Request, kernel: Kernel) -> Principal:
    """The caller, a tenant's key; 401/403 in OpenAI's shape."""
    try:
        principal = authenticate(
            bearer(request.headers.get("authorization")), kernel.keys, kernel.gateway.operator_key_sha256
        )
    except ApiError as exc:
        raise OpenAIError(exc.status, "invalid_api_key", exc.message) from None
    if principal.kind != "tenant":
        raise OpenAIError(403, "tenant_key_required", "inference routes take a tenant's API key")
    return principal


def find_endpoint(kernel: Kernel, tenant: str, model: str) -> EndpointRecord:
    """The caller's live endpoint named ``model`` (its name or id); 404 otherwise, 503 when it failed."""
    table: dict[str, EndpointRecord] = kernel.state(ENDPOINTS).endpoints
    record = table.get(endpoint_key(tenant, model))
    if record is None or record.state == "deleted":
        record = next(
            (
                e
                for e in table.values()
                if e.tenant == tenant and e.spec.name == model and e.state != "deleted"
            ),
            None,
        )
    if record is None:
        raise OpenAIError(
            404,
            "model_not_found",
            f"The model `{model}` does not exist or you do not have access to it.",
            "model",
        )
    if record.state == "failed":
        raise OpenAIError(503, "endpoint_failed", f"endpoint `{model}` failed: {record.scale_reason}")
    return record


def too_many(line: Line, now: float, message: str) -> OpenAIError:
    """A 429 in OpenAI's shape, with ``Retry-After`` estimated from the line (:meth:`Line.retry_after_s`)."""
    return OpenAIError(
        429, "rate_limit_exceeded", message, headers={"retry-after": str(line.retry_after_s(now))}
    )


async def take_slot(
    request: Request, proxy: InferenceProxy, principal: Principal, endpoint: EndpointRecord, route: str | None
) -> tuple[EndpointRecord, Waiter, Line]:
    """A slot on one of the endpoint's ready replicas, waiting in its line for one (and scaling an
    endpoint at zero up first: :func:`gateway.autoscaler.wake`); 429 when the line is full or the
    wait passes ``queue_timeout_s``, 503 when the endpoint fails meanwhile. A request whose client
    hangs up leaves the line (:class:`ClientGone`)."""
    kernel: Kernel = request.app.state.kernel
    key = endpoint_key(endpoint.tenant, endpoint.endpoint_id)
    line = proxy.line_of(key, endpoint.spec)
    now = time.monotonic()
    proxy.traffic_of(key).last_request_at = now
    deadline = now + endpoint.spec.queue_timeout_s
    try:
        waiter = line.enter(principal.key_id, route, now, proxy.candidates(_addresses(endpoint)))
    except LineFull as exc:
        proxy.refused(key)
        raise too_many(line, now, f"endpoint `{endpoint.spec.name}` is busy: {exc.message}") from None
    proxy.sample_line(key)  # the line only grows on arrivals: its peaks are seen here
    woken = False
    try:
        while waiter.address is None:
            endpoint = find_endpoint(kernel, endpoint.tenant, endpoint.endpoint_id)
            if endpoint.desired_replicas == 0 and not woken:
                await wake(kernel, endpoint)
                woken = True
            now = time.monotonic()
            line.dispatch(proxy.candidates(_addresses(endpoint)), now)
            if waiter.address is not None:
                break
            if now >= deadline:
                line.leave(waiter, now, "queue_timeout")
                proxy.refused(key)
                raise too_many(line, now, f"waited {endpoint.spec.queue_timeout_s:g}s in line for a replica")
            if await request.is_disconnected():
                raise ClientGone("the client hung up while waiting in line")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.granted.wait(), min(_WAIT_STEP_S, deadline - now))
    except BaseException as exc:  # a no-op once refused; a slot granted meanwhile is freed
        line.leave(waiter, time.monotonic(), abandoned=isinstance(exc, ClientGone | asyncio.CancelledError))
        raise
    proxy.traffic_of(key).last_request_at = time.monotonic()
    return endpoint, waiter, line


def _addresses(endpoint: EndpointRecord) -> list[str]:
    return [r.address for r in ready_replicas(endpoint)]


async def request_body(request: Request, limit: int) -> bytes:
    """The body, 413 in OpenAI's shape beyond ``limit`` bytes (:func:`gateway.api.read_body`)."""
    try:
        return await read_body(request, limit)
    except ApiError as exc:
        raise OpenAIError(exc.status, exc.code, exc.message) from None


def parse(body: bytes) -> RoutedBody:
    """What the gateway reads of a body; 400 in OpenAI's shape when it cannot."""
    try:
        return _DECODE(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise OpenAIError(400, "invalid_request", f"malformed request body: {exc}") from None
    except RecursionError:
        raise OpenAIError(400, "invalid_request", f"malformed request body: it {TOO_DEEP}") from None


def proxy_of(request: Request) -> InferenceProxy:
    proxy: InferenceProxy = request.app.state.inference
    return proxy


class ReleasingStream(StreamingResponse):
    """A streamed answer that calls ``done`` when it ends however it ends (finished, the client
    gone, cancelled), and closes its body iterator: its slot is never left held."""

    def __init__(self, content: AsyncIterator[bytes], done: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._content, self._done = content, done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await self._content.aclose()  # type: ignore[attr-defined]
            self._done()


async def forward(request: Request, path: str) -> Response:
    started = time.monotonic()
    kernel: Kernel = request.app.state.kernel
    proxy = proxy_of(request)
    try:
        principal = caller(request, kernel)
        body = await request_body(request, kernel.gateway.max_inference_body_bytes)
        parsed = parse(body)
        endpoint = find_endpoint(kernel, principal.account, parsed.model)
        route = route_key(endpoint.spec.routing, parsed, request.headers)
        endpoint, waiter, line = await take_slot(request, proxy, principal, endpoint, route)
    except OpenAIError as exc:
        return error_response(exc)
    except ClientGone:
        return Response(status_code=499)  # nobody reads it
    assert waiter.address is not None
    return await answer(request, path, body, parsed, endpoint, _Slot(line, waiter.address), started)


class _Slot:
    """The replica slot a request holds: released once, whichever path ends the request."""

    def __init__(self, line: Line, address: str) -> None:
        self.line, self.address, self.held = line, address, True

    def move(self, address: str) -> None:
        self.line.moved(self.address, address)
        self.address = address

    def release(self) -> None:
        if self.held:
            self.held = False
            self.line.release(self.address, time.monotonic())


async def answer(
    request: Request,
    path: str,
    body: bytes,
    parsed: RoutedBody,
    endpoint: EndpointRecord,
    slot: _Slot,
    started: float,
) -> Response:
    """Send the request to its replica (failing over to the others) and pass the answer back."""
    key = endpoint_key(endpoint.tenant, endpoint.endpoint_id)
    endpoint = request.app.state.kernel.state(ENDPOINTS).endpoints.get(key, endpoint)  # the latest
    waited_s = time.monotonic() - started
    strip_usage = False
    if parsed.stream:
        body, strip_usage = ask_for_usage(body)
    bound = bound_of(body)  # the replica's usage is billed within what the gateway saw
    proxy = proxy_of(request)
    headers = {h: v for h in _FORWARD_HEADERS if (v := request.headers.get(h))}
    headers["accept-encoding"] = "identity"  # usage is read off the bytes passed through
    replicas = {r.address: r for r in ready_replicas(endpoint)}
    order = sorted(replicas, key=lambda a: a != slot.address)  # its own replica first, then failover
    try:
        api_keys = {address: r.api_key for address, r in replicas.items()}
        upstream = await proxy.send(key, order, path, body, headers, api_keys)
    except NoReplica as exc:
        slot.release()
        proxy.record(key, started, ok=False, waited_s=waited_s)
        return error_response(OpenAIError(503, "no_replica", f"no replica could serve the request: {exc}"))
    except BaseException:
        slot.release()
        raise
    slot.move(upstream.address)
    replica = replicas[upstream.address]
    headers = {**upstream.headers(), REPLICA_HEADER: str(replica.slot)}
    if waited_s >= COLD_START_REPORT_S:  # the request waited for a replica: say how long
        headers[COLD_START_HEADER] = f"{waited_s:.3f}"
        log.info("%s: served after waiting %.2fs for a replica", key, waited_s)
    served = Served(proxy, request.app.state.tokens, key, endpoint, replica, slot, started, waited_s)
    if not upstream.content_type.startswith("text/event-stream"):  # one body: one send, no chunking
        try:
            content = await upstream.read()
        except UpstreamError as exc:
            served.done(ok=False, tokens=0)
            return error_response(OpenAIError(502, "replica_failed", f"the replica failed mid-answer: {exc}"))
        served.done(ok=upstream.status < 500, tokens=tokens_of(content, bound, len(content)) or 0)
        return Response(content, status_code=upstream.status, headers=headers)
    return streamed(upstream, served, SseUsage(strip=strip_usage, bound=bound), headers)


@dataclass(slots=True)
class Served:
    """What a request's end records, once: its slot released, its figures, its tokens."""

    proxy: InferenceProxy
    meter: TokenMeter
    key: str
    endpoint: EndpointRecord
    replica: ReplicaRecord
    slot: _Slot
    started: float
    waited_s: float = 0.0

    def done(self, ok: bool, tokens: int) -> None:
        if self.slot.held:
            self.slot.release()
            self.proxy.record(self.key, self.started, ok=ok, waited_s=self.waited_s)
            self.meter.add(self.endpoint, self.replica, tokens)


def streamed(upstream: Upstream, served: Served, usage: SseUsage, headers: dict[str, str]) -> Response:
    """A streamed answer passed through as it comes, its usage counted by ``usage`` (and stripped
    when only the gateway asked for it); the slot is released when the stream ends, however it ends."""
    completed = False

    async def passed_through() -> AsyncIterator[bytes]:
        nonlocal completed
        async for chunk in upstream.body():
            if passed := usage.feed(chunk):
                yield passed
        if rest := usage.finish():
            yield rest
        completed = True

    def done() -> None:
        upstream.response.release()
        served.done(ok=upstream.status < 500 and completed, tokens=usage.tokens)

    return ReleasingStream(passed_through(), done, status_code=upstream.status, headers=headers)


async def chat_completions(request: Request) -> Response:
    return await forward(request, "/v1/chat/completions")


async def completions(request: Request) -> Response:
    return await forward(request, "/v1/completions")


async def embeddings(request: Request) -> Response:
    return await forward(request, "/v1/embeddings")


async def models(request: Request) -> Response:
    kernel: Kernel = request.app.state.kernel
    try:
        tenant = caller(request, kernel).account
    except OpenAIError as exc:
        return error_response(exc)
    table: dict[str, EndpointRecord] = kernel.state(ENDPOINTS).endpoints
    data = [
        {"id": e.spec.name, "object": "model", "created": e.deployed_ns // NS_PER_S, "owned_by": tenant}
        for e in table.values()
        if e.tenant == tenant and e.state != "deleted"
    ]
    return JSONResponse({"object": "list", "data": data})


def routes() -> list[Route]:
    """The OpenAI-compatible routes (see the module docstring)."""
    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"], include_in_schema=False),
        Route("/v1/completions", completions, methods=["POST"], include_in_schema=False),
        Route("/v1/embeddings", embeddings, methods=["POST"], include_in_schema=False),
        Route("/v1/models", models, methods=["GET"], include_in_schema=False),
    ]
