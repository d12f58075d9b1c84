"""A kernel on a nats-server with accounts on: the harness of the tests that use real enrolled-agent
credentials (:mod:`tests.e2e.trust.test_nats_permissions`, :mod:`tests.e2e.trust.test_claims`); the
fixtures ``secured`` and ``stack`` are in conftest.

The gateway runs in-process (over httpx), with the sync of the server's agent users
(``resontech nats-auth``) and the intake beside it, all with the kernel's credentials; agents enroll
through the gateway and connect with their own. :func:`raw_agent` is an enrolled agent's credentials
in a plain NATS client, as an attacker would use them; :func:`violation` waits for the server to refuse
one of its publications or subscriptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats

from agent.enroll import apply, enroll
from agent.settings import load_agent_settings
from core.addresses import LOOPBACK_NETWORKS
from core.log import EventLog
from core.natsauth import KERNEL_USER
from core.settings import Settings
from gateway.app import create_app
from gateway.auth import digest
from gateway.kernel import Kernel
from gateway.settings import GatewaySettings
from ops.devstack.natsserver import NatsServer
from ops.devstack.objectstore import ObjectStoreServer
from ops.services.intake import Intake
from ops.services.natsauth import AgentUsersSync
from projections import PROVIDERS
from schemas.api.providers import Enrolled
from tests.support import until, wipe_streams


@dataclass
class Stack:
    server: NatsServer
    log: EventLog
    client: httpx.AsyncClient
    operator_key: str
    sync: AgentUsersSync
    root: Path
    kernel: Kernel
    intake: Intake

    async def post(self, path: str, key: str | None, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return await self.client.post(path, json=body, headers=headers)

    async def provider(self) -> tuple[str, str]:
        provider = f"p-{secrets.token_hex(3)}"
        response = await self.post(
            "/v1/providers", self.operator_key, {"provider": provider, "display_name": "GPU Co"}
        )
        assert response.status_code == 201, response.text
        return provider, response.json()["api_key"]["key"]

    async def tenant(self, tenant: str | None = None) -> tuple[str, str]:
        """Create a tenant; its id and its admin key."""
        tenant = tenant or f"t-{secrets.token_hex(3)}"
        body = {"tenant": tenant, "display_name": tenant}
        response = await self.post("/v1/tenants", self.operator_key, body)
        assert response.status_code == 201, response.text
        return tenant, response.json()["admin_key"]["key"]

    async def token(self, provider: str, key: str, **body: Any) -> str:
        response = await self.post(f"/v1/providers/{provider}/enrollment-tokens", key, body)
        assert response.status_code == 201, response.text
        return str(response.json()["token"])

    async def enroll(
        self, name: str, provider: str | None = None, key: str | None = None
    ) -> tuple[Enrolled, Path]:
        """Enroll a new agent state dir, and wait until the server knows its user."""
        if provider is None or key is None:
            provider, key = await self.provider()
        state_dir = self.root / name
        enrolled = await enroll(self.client, await self.token(provider, key, region="eu-north"), state_dir)
        await self.synced()
        return enrolled, state_dir

    async def synced(self) -> None:
        """Wait until the server's agents file holds every change the gateway has made."""
        # the gateway's projection, not a JetStream API call: a reload briefly interrupts that API
        await self.sync.wait_synced(self.kernel.runners[PROVIDERS.name].seq)

    async def as_agent(self, enrolled: Enrolled, state_dir: Path) -> EventLog:
        """An event log connected with the enrolled agent's own credentials."""
        return await EventLog.connect(agent_settings(enrolled, state_dir, self.log.settings))


def kernel_settings(server: NatsServer, store: ObjectStoreServer) -> Settings:
    assert server.auth is not None
    return Settings(
        nats_url=server.url,
        nats_user=KERNEL_USER,
        nats_password=server.auth.kernel_password,
        s3_endpoint=store.endpoint,
        s3_access_key=store.access_key,
        s3_secret_key=store.secret_key,
        # any network, and loopback as the dev stack allows it (never at a kernel port); a test of
        # the production rule sets the intake's networks itself (tests/e2e/trust/test_edges.py)
        replica_networks=f"0.0.0.0/0,::/0,{LOOPBACK_NETWORKS}",
    )


@contextlib.asynccontextmanager
async def running_stack(server: NatsServer, store: ObjectStoreServer, root: Path) -> AsyncIterator[Stack]:
    """The kernel beside ``server`` on fresh streams, until the block ends."""
    settings = kernel_settings(server, store)
    await wipe_streams(settings.nats_url, settings.nats_user, settings.nats_password)
    log = await EventLog.connect(settings)
    await log.ensure_streams()
    operator_key = "rt_operator0000_" + secrets.token_urlsafe(32)
    gateway = GatewaySettings(operator_key_sha256=digest(operator_key))
    kernel = Kernel(settings, gateway)
    await kernel.start()
    assert server.agents_file is not None
    sync_log = await EventLog.connect(settings, name="test-nats-auth")
    sync = AgentUsersSync(sync_log, server.agents_file, server.reload)
    intake_log = await EventLog.connect(settings, name="test-intake")
    intake = Intake(intake_log)
    stop = asyncio.Event()
    syncing = asyncio.create_task(sync.run(stop))
    # the first sync reloads the server, which silences the JetStream API for a moment: the rest
    # starts after it (consumers created in that moment fail)
    await asyncio.wait_for(sync.first_synced.wait(), 15)
    judging = asyncio.create_task(intake.run(stop))
    await until(intake.ready.is_set, "the intake caught up")
    app = create_app(settings, gateway, kernel=kernel)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway.test"
        ) as client:
            yield Stack(server, log, client, operator_key, sync, root, kernel, intake)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(syncing, judging, return_exceptions=True), 15)
        for own in (sync_log, intake_log):
            await own.close()
        await kernel.stop()
        await log.close()


def agent_settings(enrolled: Enrolled, state_dir: Path, base: Settings) -> Settings:
    _, core = apply(enrolled, load_agent_settings(state_dir.parent, {"state_dir": str(state_dir)}), base)
    return core


# -- an enrolled agent's credentials in a plain NATS client ------------------------------------------------


@contextlib.asynccontextmanager
async def raw_agent(enrolled: Enrolled) -> AsyncIterator[tuple[nats.NATS, list[str]]]:
    """A plain NATS client with the agent's credentials, and the server's errors it receives."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    creds = enrolled.nats
    nc = await nats.connect(
        creds.url,
        user=creds.user,
        password=creds.password,
        inbox_prefix=creds.inbox_prefix,
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield nc, errors
    finally:
        await nc.close()


async def violation(errors: list[str], subject: str) -> None:
    """Wait until ``errors`` (of :func:`raw_agent`) hold the server's permissions violation on ``subject``."""
    await until(
        lambda: any("permissions violation" in e and subject.lower() in e for e in errors),
        f"violation {subject}",
    )
