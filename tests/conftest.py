"""Shared fixtures: one real nats-server per test session (per xdist worker), fresh streams per test."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from core.addresses import LOOPBACK_NETWORKS
from core.cgroups import detect
from core.log import EventLog
from core.sandbox import Sandbox
from core.settings import Settings
from ops.devstack.natsserver import NatsAuth, NatsServer
from ops.devstack.objectstore import ObjectStoreServer
from tests.support import WARM_ENGINES, AgentProcess, IntakeProcess, wipe_streams
from tests.support.secured import Stack, running_stack

os.environ["RESONTECH_AGENT_WARM_ENGINES"] = WARM_ENGINES  # agents a dev stack starts in a test too


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A real nats-server with JetStream on a free loopback port and a temp store dir."""
    root = tmp_path_factory.mktemp("nats")
    server = NatsServer(root / "store", log_file=root / "nats.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """This host's sandbox, as an agent makes it (runtime tests start their workloads in it)."""
    return Sandbox.for_host(cgroups=detect())


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStoreServer]:
    """A real S3-compatible server (``rclone serve s3``) on a free loopback port, signatures checked."""
    root = tmp_path_factory.mktemp("s3")
    server = ObjectStoreServer(root / "objects", secret_key="test-secret-" + root.name.replace(",", ""))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def settings(nats_server: NatsServer, object_store: ObjectStoreServer) -> Settings:
    return Settings(
        nats_url=nats_server.url,
        ack_timeout_s=5.0,
        s3_endpoint=object_store.endpoint,
        s3_access_key=object_store.access_key,
        s3_secret_key=object_store.secret_key,
        replica_networks=LOOPBACK_NETWORKS,  # every replica of the tests serves on loopback
    )


@pytest.fixture
async def log(settings: Settings) -> AsyncIterator[EventLog]:
    """An :class:`EventLog` on empty streams."""
    await wipe_streams(settings.nats_url)
    event_log = await EventLog.connect(settings)
    await event_log.ensure_streams()
    yield event_log
    await event_log.close()


@pytest.fixture
def agents(tmp_path: Path, settings: Settings) -> Iterator[Callable[..., AgentProcess]]:
    """Start agents with ``agents(name, *flags, env={...})``, each enrolled first (as the operator:
    they run with the kernel's credentials) and the intake beside them (started with the first);
    all are stopped and cleaned up after the test."""
    started: list[AgentProcess] = []
    intake: list[IntakeProcess] = []

    def start(name: str, *extra: str, env: dict[str, str] | None = None, enroll: bool = True) -> AgentProcess:
        if not intake:
            intake.append(IntakeProcess(tmp_path, settings.nats_url).start())
        agent = AgentProcess(name, tmp_path, settings.nats_url, *extra)
        agent.env.update(env or {})
        if enroll and "--simulate" not in extra:
            agent.enroll(settings)
        agent.start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.cleanup()
    for process in intake:
        process.stop()


# -- a kernel on a nats-server with accounts on (tests/support/secured.py) -----------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A nats-server with the kernel and agent accounts (one per test module: it is reloaded)."""
    root = tmp_path_factory.mktemp("secured-nats")
    server = NatsServer(
        root / "store", log_file=root / "nats.log", auth=NatsAuth(kernel_password=secrets.token_urlsafe(24))
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def enrolled_agents(tmp_path: Path, secured: NatsServer) -> Iterator[Callable[..., AgentProcess]]:
    """Start agents enrolled through ``stack`` (their state dirs under ``tmp_path``) with
    ``enrolled_agents(name, env={...})``: no kernel credentials in their environment, only their own."""
    started: list[AgentProcess] = []

    def start(name: str, env: dict[str, str] | None = None) -> AgentProcess:
        agent = AgentProcess(name, tmp_path, secured.url)
        agent.env.update(env or {})
        agent.start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.cleanup()


@pytest.fixture
async def stack(secured: NatsServer, object_store: ObjectStoreServer, tmp_path: Path) -> AsyncIterator[Stack]:
    """The kernel (gateway, agent-user sync, intake) on fresh streams of the ``secured`` server."""
    async with running_stack(secured, object_store, tmp_path) as kernel:
        yield kernel
