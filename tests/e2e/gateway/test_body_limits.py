"""Request bodies are capped before they are read, and JSON nested too deeply is a 400, not a 500.

Before the fix the OpenAI-compatible routes read any body whole (a 60 MB body was read, then answered
400) and a body nested 100,000 deep made msgspec raise ``RecursionError``: a 500 with a traceback.
The rest of the API already capped bodies (``RESONTECH_GATEWAY_MAX_BODY_BYTES``); the inference
routes now cap theirs too, at ``RESONTECH_GATEWAY_MAX_INFERENCE_BODY_BYTES``."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import msgspec
import pytest
from starlette.applications import Starlette

from gateway.api import Call, Operation, starlette_routes
from gateway.app import operations
from gateway.auth import digest
from gateway.errors import EXCEPTION_HANDLERS
from gateway.settings import GatewaySettings, load_gateway_settings
from tests.support.gateway import Api, ServeGateway

LIMIT = 1024 * 1024
CHUNK = 64 * 1024
SIXTY_MB = 60 * 1024 * 1024
DEEP = 100_000
INFERENCE_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


@pytest.fixture
def gateway_settings(operator_key: str) -> GatewaySettings:
    return GatewaySettings(
        operator_key_sha256=digest(operator_key), max_body_bytes=64 * 1024, max_inference_body_bytes=LIMIT
    )


class Upload:
    """A streamed request body of ``size`` bytes that counts the chunks the server pulled."""

    def __init__(self, size: int = SIXTY_MB) -> None:
        self.chunks = size // CHUNK
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.pulled += 1
            yield b"x" * CHUNK


def deep_bodies() -> dict[str, bytes]:
    arrays = "[" * DEEP + "]" * DEEP
    objects = '{"a":' * DEEP + "1" + "}" * DEEP
    return {
        "arrays": arrays.encode(),
        "objects": objects.encode(),
        "arrays in a field": f'{{"model": "m", "messages": {arrays}}}'.encode(),
        "objects in a field": f'{{"model": "m", "input": {objects}}}'.encode(),
    }


def openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert error["type"] == "invalid_request_error" and error["message"]
    return dict(error)


def no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


@pytest.mark.parametrize("path", INFERENCE_ROUTES)
async def test_a_declared_oversize_inference_body_is_refused_before_a_byte_is_read(
    api: Api, path: str
) -> None:
    _, admin = await api.tenant()
    body = Upload()
    headers = {"content-length": str(SIXTY_MB), "content-type": "application/json"}
    response = await api.request("POST", path, admin, content=body, headers=headers)
    error = openai_error(response, 413, "body_too_large")
    assert f"{LIMIT:,}" in error["message"]
    assert body.pulled == 0


@pytest.mark.parametrize("path", INFERENCE_ROUTES)
async def test_a_chunked_inference_body_is_cut_off_once_it_passes_the_limit(api: Api, path: str) -> None:
    _, admin = await api.tenant()
    body = Upload()
    response = await api.request("POST", path, admin, content=body)  # no length: chunked
    openai_error(response, 413, "body_too_large")
    assert body.pulled <= LIMIT // CHUNK + 1, f"read {body.pulled} chunks of {body.chunks}"


async def test_an_unauthenticated_inference_body_is_not_read_at_all(api: Api) -> None:
    body = Upload()
    response = await api.request("POST", "/v1/chat/completions", None, content=body)
    assert response.status_code == 401 and body.pulled == 0


@pytest.mark.parametrize("name", list(deep_bodies()))
@pytest.mark.parametrize("path", INFERENCE_ROUTES)
async def test_deeply_nested_inference_json_is_a_400_in_openais_shape(
    api: Api, path: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, admin = await api.tenant()
    body = deep_bodies()[name]
    assert len(body) < LIMIT
    response = await api.request(
        "POST", path, admin, content=body, headers={"content-type": "application/json"}
    )
    openai_error(response, 400, "invalid_request")
    no_error_logged(caplog)


async def test_no_api_route_answers_deep_json_with_a_5xx(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    _, admin = await api.tenant()
    small = {
        "arrays": b"[" * 20_000 + b"]" * 20_000,  # within the API's 64 KiB test limit
        "objects": b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    }
    checked = 0
    for operation in operations():
        if operation.body is None:
            continue
        path = re.sub(r"{(\w+)(?::\w+)?}", "x", operation.path)
        for key in (admin, api.operator_key):
            for deep in small.values():
                fields = [b"zzz", *(f.encode_name.encode() for f in msgspec.structs.fields(operation.body))]
                for field in fields:
                    body = b'{"' + field + b'": ' + deep + b"}"
                    response = await api.request(operation.method, path, key, content=body)
                    assert response.status_code < 500, (operation.method, path, field, response.text)
                    checked += 1
    assert checked > 20
    no_error_logged(caplog)


class Nested(msgspec.Struct, forbid_unknown_fields=True):
    """A body that may nest (as a future body with free-form JSON would)."""

    document: dict[str, Any]


async def echo(call: Call[Nested, None]) -> dict[str, Any]:
    return {"keys": sorted(call.body.document)}


async def test_the_api_wrapper_answers_deep_json_in_any_body_with_a_400(
    caplog: pytest.LogCaptureFixture,
) -> None:
    operation = Operation("POST", "/nested", echo, summary="echo", tag="test", access="public", body=Nested)
    app = Starlette(routes=starlette_routes([operation]), exception_handlers=dict(EXCEPTION_HANDLERS))
    app.state.kernel = SimpleNamespace(gateway=load_gateway_settings({}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        fine = await client.post("/nested", content=b'{"document": {"a": [[1]]}}')
        assert fine.status_code == 200 and fine.json() == {"keys": ["a"]}
        for deep in (b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP):
            response = await client.post("/nested", content=b'{"document": {"a": ' + deep + b"}}")
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "invalid_body" and "too deeply" in error["message"]
    no_error_logged(caplog)


# --- against a served gateway (granian, a real socket) ------------------------------------------------


async def raw_request(url: str, head: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode())
    await writer.drain()
    return reader, writer


async def test_a_served_gateway_answers_a_declared_60_mb_body_at_once(serve_gateway: ServeGateway) -> None:
    server = await serve_gateway(RESONTECH_GATEWAY_MAX_INFERENCE_BODY_BYTES=str(LIMIT))
    _, admin = await server.tenant()
    started = time.monotonic()
    reader, writer = await raw_request(
        server.url,
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {admin}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {SIXTY_MB}\r\n\r\n",
    )
    try:
        status_line = await asyncio.wait_for(reader.readline(), 5.0)  # not one byte of the body was sent
        assert status_line.startswith(b"HTTP/1.1 413"), status_line
        assert time.monotonic() - started < 5.0
    finally:
        writer.close()


async def test_a_served_gateway_cuts_a_chunked_body_off_at_the_limit(serve_gateway: ServeGateway) -> None:
    server = await serve_gateway(RESONTECH_GATEWAY_MAX_INFERENCE_BODY_BYTES=str(LIMIT))
    _, admin = await server.tenant()
    reader, writer = await raw_request(
        server.url,
        f"POST /v1/embeddings HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {admin}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    sent = 0
    answer = asyncio.ensure_future(reader.readline())
    try:
        while not answer.done() and sent < SIXTY_MB:
            writer.write(b"%x\r\n" % CHUNK + b"x" * CHUNK + b"\r\n")
            sent += CHUNK
            try:
                await asyncio.wait_for(writer.drain(), 5.0)
            except (ConnectionError, TimeoutError):
                break
            await asyncio.sleep(0)
        try:
            status_line = await asyncio.wait_for(answer, 5.0)
        except ConnectionError:
            # The gateway answered and closed while we were still writing: TCP resets the connection
            # and drops the unread 413 with it. Either way it stopped reading at the limit.
            status_line = b"(reset after the gateway stopped reading)"
        assert status_line.startswith((b"HTTP/1.1 413", b"(reset")), status_line
        assert sent < SIXTY_MB // 4, f"the gateway read {sent:,} bytes before answering"
    finally:
        answer.cancel()
        writer.close()
