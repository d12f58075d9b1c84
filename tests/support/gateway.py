"""Gateway fixtures: the app in-process over httpx (lifespan run by hand), an operator key, tenants.

``api`` talks to the app through ``httpx.ASGITransport``: real routing, auth, log and object store,
no sockets. Tests that need a real server (WebSockets, the browser, SDK uploads) use
``gateway_server``: ``python -m ops.cli gateway`` (granian) in a child process on a free loopback
port, on the same fresh streams; ``serve_gateway(RESONTECH_GATEWAY_FEED_QUEUE="8")`` starts one with
extra settings.

The requests tests of several API areas repeat sit at the end: :func:`spec` and :func:`submit` a job,
:func:`deploy_body` and :func:`deploy` an endpoint (each returns the response, whatever its status).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.log import EventLog
from core.settings import Settings
from gateway.app import create_app
from gateway.auth import digest
from gateway.kernel import Kernel
from gateway.settings import GatewaySettings
from ops.ports import free_port
from ops.process import log_tail, signal_group, spawn, terminate
from tests.support import REPO


class Api:
    """An httpx client on the app, plus the operator key and helpers to make tenants."""

    def __init__(self, client: httpx.AsyncClient, kernel: Kernel | None, operator_key: str) -> None:
        self.client = client
        self.kernel = kernel
        self.operator_key = operator_key

    def auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    async def request(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> httpx.Response:
        headers = kwargs.pop("headers", {})
        if key is not None:
            headers.update(self.auth(key))
        return await self.client.request(method, path, headers=headers, **kwargs)

    async def tenant(self, tenant: str | None = None) -> tuple[str, str]:
        """Create a tenant; returns ``(tenant id, its admin key)``."""
        tenant = tenant or f"t-{secrets.token_hex(4)}"
        response = await self.request(
            "POST", "/v1/tenants", self.operator_key, json={"tenant": tenant, "display_name": tenant}
        )
        assert response.status_code == 201, response.text
        return tenant, response.json()["admin_key"]["key"]

    async def key(self, tenant: str, admin_key: str, role: str) -> str:
        response = await self.request("POST", f"/v1/tenants/{tenant}/keys", admin_key, json={"role": role})
        assert response.status_code == 201, response.text
        return str(response.json()["key"])


@pytest.fixture
def operator_key() -> str:
    return "rt_operator0000_" + secrets.token_urlsafe(32)


@pytest.fixture
def gateway_settings(operator_key: str) -> GatewaySettings:
    return GatewaySettings(operator_key_sha256=digest(operator_key), max_body_bytes=64 * 1024)


@pytest.fixture
async def api(
    log: EventLog, settings: Settings, gateway_settings: GatewaySettings, operator_key: str
) -> AsyncIterator[Api]:
    """The gateway app in-process on empty streams, with its kernel started."""
    kernel = Kernel(settings, gateway_settings)
    await kernel.start()
    app = create_app(settings, gateway_settings, kernel=kernel)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
        yield Api(client, kernel, operator_key)
    await kernel.stop()


MakeTenant = Callable[[], Awaitable[tuple[str, str]]]


class GatewayServer(Api):
    """A gateway served by granian in a child process; ``kernel`` is ``None`` (it lives over there).

    Attributes:
        url / ws_url: ``http://127.0.0.1:<port>`` and ``ws://127.0.0.1:<port>``.
        log_file: the server's stdout and stderr.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        operator_key: str,
        log_file: Path,
        proc: subprocess.Popen[bytes],
    ) -> None:
        super().__init__(client, None, operator_key)
        self.url = url
        self.ws_url = "ws" + url.removeprefix("http")
        self.log_file = log_file
        self.proc = proc

    def output(self) -> str:
        """The end of the server's log (for assertion messages)."""
        return "\n".join(log_tail(self.log_file, 40))

    def kill(self) -> None:
        """``kill -9`` the whole gateway (its process group): nothing of it answers or closes cleanly."""
        signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, but nothing is answered."""
        signal_group(self.proc.pid, signal.SIGSTOP)


ServeGateway = Callable[..., Awaitable[GatewayServer]]


@pytest.fixture
async def serve_gateway(
    log: EventLog, settings: Settings, operator_key: str, tmp_path: Path
) -> AsyncIterator[ServeGateway]:
    """Start served gateways with ``await serve_gateway(RESONTECH_GATEWAY_X="...")``; all are stopped
    after the test."""
    started: list[tuple[subprocess.Popen[bytes], httpx.AsyncClient]] = []

    async def start(**extra_env: str) -> GatewayServer:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        env.update(
            RESONTECH_NATS_URL=settings.nats_url,
            RESONTECH_S3_ENDPOINT=settings.s3_endpoint,
            RESONTECH_S3_ACCESS_KEY=settings.s3_access_key,
            RESONTECH_S3_SECRET_KEY=settings.s3_secret_key,
            RESONTECH_REPLICA_NETWORKS=settings.replica_networks,
            RESONTECH_DATA_DIR=str(tmp_path),
            RESONTECH_GATEWAY_PORT=str(port),
            RESONTECH_GATEWAY_OPERATOR_KEY_SHA256=digest(operator_key),
            PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            **extra_env,
        )
        log_file = tmp_path / f"gateway-{port}.log"
        proc = spawn([sys.executable, "-m", "ops.cli", "gateway"], log_file, env)
        url = f"http://127.0.0.1:{port}"
        client = httpx.AsyncClient(base_url=url, timeout=10.0)
        started.append((proc, client))
        deadline = time.monotonic() + 60.0
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {proc.returncode}: {log_tail(log_file, 20)}")
            try:
                if (await client.get("/v1/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not serve within 60 s: {log_tail(log_file, 20)}")
            await asyncio.sleep(0.1)
        return GatewayServer(client, url, operator_key, log_file, proc)

    yield start
    for proc, client in started:
        await client.aclose()
        signal_group(proc.pid, signal.SIGCONT)  # a paused one must hear the SIGTERM
        await asyncio.to_thread(terminate, proc, 10.0)


@pytest.fixture
async def gateway_server(serve_gateway: ServeGateway) -> GatewayServer:
    """A served gateway (granian, real sockets) on the test's fresh streams, with the operator key."""
    return await serve_gateway()


# -- requests the jobs and endpoints API tests repeat ------------------------------------------------------

SPEC: dict[str, Any] = {"name": "hello", "kind": "process", "command": ["python", "-c", "print(1)"]}


def spec(**changes: Any) -> dict[str, Any]:
    return {**SPEC, **changes}


async def submit(api: Api, key: str | None, body: dict[str, Any], **kwargs: Any) -> Any:
    return await api.request("POST", "/v1/jobs", key, json=body, **kwargs)


DEPLOY: dict[str, Any] = {"name": "chat", "model": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def deploy_body(**changes: Any) -> dict[str, Any]:
    return {**DEPLOY, **changes}


async def deploy(api: Api, key: str | None, body: dict[str, Any], **kwargs: Any) -> Any:
    return await api.request("POST", "/v1/endpoints", key, json=body, **kwargs)
