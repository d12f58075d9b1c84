"""Gateway fixtures: the app in-process over httpx (lifespan run by hand), an operator key, tenants.

``api`` talks to the app through ``httpx.ASGITransport``: real routing, auth, log and object store,
no sockets. Tests that need a real server (WebSockets, the browser, SDK uploads) start one with
``gateway_server``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from core.log import EventLog
from core.settings import Settings
from gateway.app import create_app
from gateway.auth import digest
from gateway.kernel import Kernel
from gateway.settings import GatewaySettings


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
