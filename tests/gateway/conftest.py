"""Gateway fixtures: the app in-process over httpx (lifespan run by hand), an operator key, tenants.

``api`` talks to the app through ``httpx.ASGITransport``: real routing, auth, log and object store,
no sockets. Tests that need a real server (WebSockets, the browser, SDK uploads) start one with
``gateway_server``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
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
from tests.support import REPO


class Api:
    """An httpx client on the app, plus the operator key and helpers to make tenants."""

    def __init__(self, client: httpx.AsyncClient, kernel: Kernel, operator_key: str) -> None:
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


class ServedGateway:
    """A real gateway process (``resontech gateway``: granian, uvloop) on a free loopback port."""

    def __init__(self, settings: Settings, operator_key: str, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.operator_key = operator_key
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        env.update(
            RESONTECH_NATS_URL=settings.nats_url,
            RESONTECH_S3_ENDPOINT=settings.s3_endpoint,
            RESONTECH_S3_ACCESS_KEY=settings.s3_access_key,
            RESONTECH_S3_SECRET_KEY=settings.s3_secret_key,
            RESONTECH_GATEWAY_PORT=str(self.port),
            RESONTECH_GATEWAY_OPERATOR_KEY_SHA256=digest(operator_key),
        )
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "gateway"], cwd=REPO, env=self.env, stdout=out, stderr=out
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gateway exited {self.proc.returncode}:\n{self.log_path.read_text()[-2000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/health", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"gateway not up within {timeout} s:\n{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def gateway_server(
    log: EventLog, settings: Settings, operator_key: str, tmp_path: Path
) -> Iterator[ServedGateway]:
    """A served gateway on empty streams (the operator key is ``gateway_server.operator_key``)."""
    server = ServedGateway(settings, operator_key, tmp_path / "gateway.log")
    server.start()
    yield server
    server.stop()
