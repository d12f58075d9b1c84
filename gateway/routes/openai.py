"""OpenAI-compatible inference routes: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/models``.

These are not :class:`gateway.api.Router` operations, on purpose: OpenAI's clients expect OpenAI's
error body, ``{"error": {"message", "type", "param", "code"}}``, where the rest of the API answers
``{"error": {"code", "message"}}``; and a response here is the replica's own bytes (SSE streams
included) passed through, never re-encoded. They are also not in the OpenAPI document (OpenAI's
own specification describes them).

Tokens are metered here (:mod:`gateway.token_counts`, :mod:`gateway.token_meter`): the ``usage`` of every
response is counted for the replica that served it. A streaming request is sent with
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
is read, or as soon as a chunked body passes the limit. A request that finds no ready replica
waits up to ``COLD_START_WAIT_S`` for one (a replica starting, or a scale-up from zero) before a 503;
an endpoint that failed (its replicas kept failing to start) is a 503 ``endpoint_failed`` with the
reason, at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from core.clock import NS_PER_S
from core.errors import ResontechError
from gateway.api import TOO_DEEP, read_body
from gateway.auth import authenticate, bearer
from gateway.autoscaler import wake
from gateway.errors import ApiError
from gateway.inference import InferenceProxy, NoReplica, UpstreamError
from gateway.kernel import Kernel
from gateway.token_counts import SseUsage, ask_for_usage, tokens_of
from gateway.token_meter import TokenMeter
from projections import ENDPOINTS
from projections.endpoints import EndpointRecord, ReplicaRecord, endpoint_key, ready_replicas

log = logging.getLogger("resontech.gateway")
COLD_START_WAIT_S = 120.0
COLD_START_REPORT_S = 0.05
COLD_START_HEADER = "x-resontech-cold-start-s"
"""Seconds a request waited for a ready replica (a scale-up from zero, or a replica starting)."""
REPLICA_HEADER = "x-resontech-replica"
"""Names the replica slot that served a response (for debugging and the round-robin tests)."""
_WAIT_STEP_S = 0.1
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    502: "api_error",
    503: "service_unavailable",
}
_FORWARD_HEADERS = ("accept", "content-type")


class OpenAIError(ResontechError):
    """An error in OpenAI's shape."""

    code = "openai"

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param


def error_response(exc: OpenAIError) -> Response:
    body = {"error": {"message": exc.message, "type": _ERROR_TYPES.get(exc.status, "api_error"),
                      "param": exc.param, "code": exc.code}}  # fmt: skip
    return JSONResponse(body, status_code=exc.status)


class InferenceRequest(msgspec.Struct):
    """What the gateway reads of a request body: the endpoint it names, and whether it streams.
    Every other field goes to the engine untouched (unknown fields are allowed, unlike the API's)."""

    model: str
    stream: bool = False


_DECODE = msgspec.json.Decoder(InferenceRequest).decode


def tenant_for(request: Request, kernel: Kernel) -> str:
    """The caller's tenant; 401/403 in OpenAI's shape."""
    try:
        principal = authenticate(bearer(request.headers.get("authorization")), kernel.keys,
                                 kernel.gateway.operator_key_sha256)  # fmt: skip
    except ApiError as exc:
        raise OpenAIError(exc.status, "invalid_api_key", exc.message) from None
    if principal.kind != "tenant":
        raise OpenAIError(403, "tenant_key_required", "inference routes take a tenant's API key")
    return principal.account


def find_endpoint(kernel: Kernel, tenant: str, model: str) -> EndpointRecord:
    """The caller's live endpoint named ``model`` (its name or id); 404 otherwise."""
    table: dict[str, EndpointRecord] = kernel.state(ENDPOINTS).endpoints
    record = table.get(endpoint_key(tenant, model))
    if record is None or record.state == "deleted":
        record = next((e for e in table.values() if e.tenant == tenant and e.spec.name == model
                       and e.state != "deleted"), None)  # fmt: skip
    if record is None:
        raise OpenAIError(
            404,
            "model_not_found",
            f"The model `{model}` does not exist or you do not have access to it.",
            "model",
        )
    return record


async def ready_replicas_of(
    kernel: Kernel, tenant: str, model: str, wait_s: float
) -> tuple[EndpointRecord, dict[str, ReplicaRecord]]:
    """The endpoint and its ready replicas by address, waiting up to ``wait_s`` for one; an endpoint
    at zero replicas is scaled up first (:func:`gateway.autoscaler.wake`); a failed one is a 503."""
    deadline = time.monotonic() + wait_s
    woken = False
    while True:
        record = find_endpoint(kernel, tenant, model)
        if record.state == "failed":
            raise OpenAIError(503, "endpoint_failed", f"endpoint `{model}` failed: {record.scale_reason}")
        replicas = {r.address: r for r in ready_replicas(record)}
        if replicas or time.monotonic() >= deadline:
            return record, replicas
        if record.desired_replicas == 0 and not woken:
            await wake(kernel, record)
            woken = True
        await asyncio.sleep(_WAIT_STEP_S)


async def request_body(request: Request, limit: int) -> bytes:
    """The body, 413 in OpenAI's shape beyond ``limit`` bytes (:func:`gateway.api.read_body`)."""
    try:
        return await read_body(request, limit)
    except ApiError as exc:
        raise OpenAIError(exc.status, exc.code, exc.message) from None


def parse(body: bytes) -> InferenceRequest:
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


async def forward(request: Request, path: str) -> Response:
    started = time.monotonic()
    kernel: Kernel = request.app.state.kernel
    try:
        tenant = tenant_for(request, kernel)
        body = await request_body(request, kernel.gateway.max_inference_body_bytes)
        parsed = parse(body)
        endpoint, replicas = await ready_replicas_of(kernel, tenant, parsed.model, COLD_START_WAIT_S)
        waited_s = time.monotonic() - started
    except OpenAIError as exc:
        return error_response(exc)
    key = endpoint_key(endpoint.tenant, endpoint.endpoint_id)
    strip_usage = False
    if parsed.stream:
        body, strip_usage = ask_for_usage(body)
    proxy = proxy_of(request)
    headers = {h: v for h in _FORWARD_HEADERS if (v := request.headers.get(h))}
    headers["accept-encoding"] = "identity"  # usage is read off the bytes passed through
    try:
        api_keys = {address: r.api_key for address, r in replicas.items()}
        upstream = await proxy.send(key, list(replicas), path, body, headers, api_keys)
    except NoReplica as exc:
        proxy.record(key, started, ok=False)
        return error_response(OpenAIError(503, "no_replica", f"no replica could serve the request: {exc}"))
    ok = upstream.status < 500
    replica = replicas[upstream.address]
    meter: TokenMeter = request.app.state.tokens
    headers = {**upstream.headers(), REPLICA_HEADER: str(replica.slot)}
    if waited_s >= COLD_START_REPORT_S:  # the request waited for a replica: say how long
        headers[COLD_START_HEADER] = f"{waited_s:.3f}"
        log.info("%s: served after a %.2fs cold start", key, waited_s)
    if not upstream.content_type.startswith("text/event-stream"):  # one body: one send, no chunking
        try:
            content = await upstream.read()
        except UpstreamError as exc:
            proxy.record(key, started, ok=False)
            return error_response(OpenAIError(502, "replica_failed", f"the replica failed mid-answer: {exc}"))
        proxy.record(key, started, ok=ok)
        meter.add(endpoint, replica, tokens_of(content) or 0)
        return Response(content, status_code=upstream.status, headers=headers)
    usage = SseUsage(strip=strip_usage)

    async def body_then_record() -> Any:
        completed = False
        try:
            async for chunk in upstream.body():
                if passed := usage.feed(chunk):
                    yield passed
            if rest := usage.finish():
                yield rest
            completed = True
        finally:
            proxy.record(key, started, ok=ok and completed)
            meter.add(endpoint, replica, usage.tokens)

    return StreamingResponse(body_then_record(), status_code=upstream.status, headers=headers)


async def chat_completions(request: Request) -> Response:
    return await forward(request, "/v1/chat/completions")


async def completions(request: Request) -> Response:
    return await forward(request, "/v1/completions")


async def embeddings(request: Request) -> Response:
    return await forward(request, "/v1/embeddings")


async def models(request: Request) -> Response:
    kernel: Kernel = request.app.state.kernel
    try:
        tenant = tenant_for(request, kernel)
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
