"""Routes as data: one :class:`Operation` per route carries its access rule, body, query and response
types; one wrapper turns it into a Starlette route; the same list produces the OpenAPI document.

A handler is ``async def handler(call: Call) -> Struct | list | Response``: ``call`` holds the
authenticated principal, the decoded body and query, the path parameters and the kernel. The wrapper
authenticates, checks access, decodes the body (msgspec, unknown fields refused, size capped, nesting
bounded), runs the handler, encodes the result, and records every successful mutating request as an
``api.request`` event (who, what, when).
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from core.errors import ResontechError
from core.streams import audit_subject
from gateway.auth import Access, Principal, authenticate, bearer, check_access
from gateway.errors import ApiError, NotYetVisible, accepted_response, as_api_error, error_response
from schemas.audit import RequestRecorded

if TYPE_CHECKING:
    from gateway.kernel import Kernel

B = TypeVar("B")
Q = TypeVar("Q")
Handler = Callable[["Call[Any, Any]"], Awaitable[Any]]
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_ENCODER = msgspec.json.Encoder()
log = logging.getLogger("resontech.gateway")
_PARAM = re.compile(r"{(\w+)(?::\w+)?}")


@dataclass(frozen=True)
class Operation:
    """One route.

    Attributes:
        access: who may call it (``public``: no key; ``any``: any valid key; ``operator``, ``tenant``,
            ``provider``: that kind of account, the operator always included).
        role: the least tenant role needed (``viewer`` reads, ``member`` writes, ``admin`` keys).
        body / query: request body and query-string types (Structs forbidding unknown fields).
        response: the success body type (for OpenAPI); ``status`` its status code.
        errors: statuses this route can answer besides the common ones, with what they mean.
        accepted: when set, the route may also answer 202 with the same body type, meaning this
            (a write stored but not yet visible here, :class:`~gateway.errors.NotYetVisible`).
    """

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    access: Access = "tenant"
    role: str = "viewer"
    body: Any = None
    query: Any = None
    response: Any = None
    status: int = 200
    errors: dict[int, str] = field(default_factory=dict)
    accepted: str = ""

    @property
    def operation_id(self) -> str:
        return self.handler.__name__


@dataclass
class Call(Generic[B, Q]):
    """What a handler gets."""

    request: Request
    kernel: Kernel
    principal: Principal
    body: B
    query: Q
    params: dict[str, str]
    resource: str = ""
    """Set by a handler to the id it created or changed (recorded in the audit event)."""


class Router:
    """Collects the operations of one area (``router.post(...)`` as a decorator)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.operations: list[Operation] = []

    def add(self, method: str, path: str, **options: Any) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            summary = options.pop("summary", None) or (handler.__doc__ or "").strip().splitlines()[0]
            self.operations.append(Operation(method, path, handler, summary=summary, tag=self.tag, **options))
            return handler

        return register

    def get(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self.add("GET", path, **options)

    def post(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self.add("POST", path, **options)

    def put(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self.add("PUT", path, **options)

    def delete(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        return self.add("DELETE", path, **options)


def respond(value: Any, status: int = 200) -> Response:
    """JSON response of a Struct, list or dict (msgspec-encoded)."""
    if isinstance(value, Response):
        return value
    if value is None:
        return Response(status_code=204 if status == 200 else status)
    return Response(_ENCODER.encode(value), status_code=status, media_type="application/json")


TOO_DEEP = "nests arrays or objects too deeply (JSON here may nest at most ~1,000 levels)"
"""Why a body msgspec refused with ``RecursionError`` is a 400: its decoder stops at a fixed depth."""


def _validation_message(exc: msgspec.ValidationError | msgspec.DecodeError, where: str) -> str:
    text = str(exc)
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return f"{where} is not valid JSON: {text}"
    return f"{where}: {text}"


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 beyond ``limit`` bytes (checked while reading)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body_too_large", f"the request body is over the {limit:,}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body_too_large", f"the request body is over the {limit:,}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_query(request: Request, query_type: Any) -> Any:
    raw: dict[str, Any] = {}
    for key, value in request.query_params.multi_items():
        raw.setdefault(key, value)
    try:
        return msgspec.convert(raw, query_type, strict=False)
    except msgspec.ValidationError as exc:
        raise ApiError(400, "invalid_query", _validation_message(exc, "query")) from None


def endpoint(operation: Operation) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint that runs ``operation``."""
    decoder = msgspec.json.Decoder(operation.body) if operation.body is not None else None

    async def run(request: Request) -> Response:
        kernel: Kernel = request.app.state.kernel
        request_id = request.scope.setdefault("request_id", secrets.token_hex(8))
        try:
            if operation.access == "public":
                principal = Principal(kind="operator", account="", role="viewer", key_id="")
            else:
                key = bearer(request.headers.get("authorization"))
                principal = authenticate(key, kernel.keys, kernel.gateway.operator_key_sha256)
                check_access(principal, operation.access, operation.role)
            query = decode_query(request, operation.query) if operation.query is not None else None
            body = None
            if decoder is not None:
                data = await read_body(request, kernel.gateway.max_body_bytes)
                if not data:
                    raise ApiError(400, "invalid_body", "this route needs a JSON body")
                try:
                    body = decoder.decode(data)
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    raise ApiError(400, "invalid_body", _validation_message(exc, "body")) from None
                except RecursionError:
                    raise ApiError(400, "invalid_body", f"body {TOO_DEEP}") from None
            call: Call[Any, Any] = Call(
                request=request,
                kernel=kernel,
                principal=principal,
                body=body,
                query=query,
                params=dict(request.path_params),
            )
            try:
                result = await operation.handler(call)
            except ApiError:
                raise
            except NotYetVisible as exc:  # stored: never a 5xx, which would invite a duplicate
                result = accepted_response(exc)
            except ResontechError as exc:
                raise as_api_error(exc) from None
            response = respond(result, operation.status)
        except ApiError as exc:
            response = error_response(exc.status, exc.code, exc.message, exc.headers)
            response.headers["x-request-id"] = request_id
            return response
        if request.method in MUTATING and response.status_code < 400 and operation.access != "public":
            try:
                await record_request(call, operation, response.status_code, request_id)
            except ResontechError as exc:  # the change itself is stored; say loudly what is missing
                log.error("audit record of request %s not stored: %s", request_id, exc)
        response.headers["x-request-id"] = request_id
        return response

    run.__name__ = operation.operation_id
    return run


async def record_request(call: Call[Any, Any], operation: Operation, status: int, request_id: str) -> None:
    """Append the ``api.request`` audit event of an accepted mutating request (event id
    ``req-<request_id>``, so a retried append stores it once)."""
    principal = call.principal
    account = principal.account or "_operator"
    client = call.request.client
    event = RequestRecorded(
        principal=principal.label,
        principal_kind=principal.kind,
        key_id=principal.key_id,
        role=principal.role,
        method=call.request.method,
        route=operation.path,
        path=call.request.url.path,
        status=status,
        resource=call.resource,
        request_id=request_id,
        remote=client.host if client else "",
    )
    await call.kernel.event_log.append(
        audit_subject(account, principal.kind), event, event_id=f"req-{request_id}"
    )


def starlette_routes(operations: list[Operation]) -> list[Route]:
    """One Starlette route per path, dispatching on method."""
    by_path: dict[str, dict[str, Operation]] = {}
    for operation in operations:
        by_path.setdefault(operation.path, {})[operation.method] = operation
    routes = []
    for path, methods in by_path.items():
        endpoints = {method: endpoint(op) for method, op in methods.items()}

        async def dispatch(request: Request, _endpoints: dict[str, Any] = endpoints) -> Response:
            handler = _endpoints.get(request.method)
            if handler is None:
                return error_response(405, "method_not_allowed", f"{request.method} is not allowed here")
            result: Response = await handler(request)
            return result

        routes.append(Route(path, dispatch, methods=list(methods)))
    return routes


# ---------------------------------------------------------------------------------------------------
# OpenAPI 3.1


COMMON_ERRORS = {
    400: "malformed request: the message says what to fix",
    401: "missing, unknown or revoked API key",
    403: "the key's account kind or role may not do this",
    404: "not found (another account's resource is not found either)",
    413: "request body too large",
}


def openapi(operations: list[Operation], *, title: str, version: str, server_url: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``, schemas from their msgspec types."""
    from schemas.api.common import ErrorBody

    types: list[Any] = [ErrorBody]
    for op in operations:
        types += [t for t in (op.body, op.response) if t is not None]
    unique = list(dict.fromkeys(types))
    refs, components = msgspec.json.schema_components(unique, ref_template="#/components/schemas/{name}")
    schema_of = dict(zip(unique, refs, strict=True))
    error_ref = {"application/json": {"schema": schema_of[ErrorBody]}}
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(_PARAM.sub(r"{\1}", op.path), {})[op.method.lower()] = _operation_object(
            op, schema_of, error_ref
        )
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "servers": [{"url": server_url}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer", "bearerFormat": "rt_..."}},
        },
    }


def _operation_object(op: Operation, schema_of: dict[Any, Any], error_ref: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI Operation Object of ``op``: its parameters, request body and responses, with
    ``schema_of`` mapping each body and response type to its ``$ref``."""
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PARAM.findall(op.path)
    ]
    if op.query is not None:
        (query_schema,), query_components = msgspec.json.schema_components([op.query], ref_template="{name}")
        query_def = query_components[query_schema["$ref"]]
        required = set(query_def.get("required", []))
        for name, prop in query_def.get("properties", {}).items():
            parameters.append({"name": name, "in": "query", "required": name in required, "schema": prop})
    responses: dict[str, Any] = {}
    if op.response is not None:
        responses[str(op.status)] = {
            "description": op.summary,
            "content": {"application/json": {"schema": schema_of[op.response]}},
        }
    else:
        responses[str(op.status)] = {"description": op.summary}
    if op.accepted:
        responses["202"] = {**responses[str(op.status)], "description": op.accepted}
    for status, meaning in {**COMMON_ERRORS, **op.errors}.items():
        if status == 401 and op.access == "public" and 401 not in op.errors:
            continue  # a public route answers 401 only when its own credential is bad
        responses[str(status)] = {"description": meaning, "content": error_ref}
    entry: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if op.access != "public":
        entry["security"] = [{"apiKey": []}]
    if op.body is not None:
        entry["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema_of[op.body]}},
        }
    return entry
