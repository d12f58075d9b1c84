"""Enrollment: trade a provider's one-time token for this host's own NATS credentials.

``resontech agent --enroll-token rte_... --gateway URL`` posts the token, the worker id (created in
the state dir if new) and the host name to ``POST /v1/agents/enroll``, and keeps the answer in
``<state_dir>/enrollment.json`` (owner-readable only). From then on every start of the agent with
that state dir reads it: the agent connects with its own credentials, which allow only its own
subjects (:mod:`core.natsauth`), and registers as the provider, pool, region and owner tenant that the
token named, whatever the flags say. A token given to an agent that is already enrolled is not used.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

import httpx
import msgspec

from agent.identity import worker_id
from agent.settings import AgentSettings
from core.errors import ConfigError, LogUnavailable
from core.files import write_private
from core.log import EventLog
from core.settings import Settings
from schemas.api.providers import Enrolled

log = logging.getLogger("resontech.agent")
ENROLLMENT_FILE = "enrollment.json"
ACTIVATION_TIMEOUT_S = 30.0
"""How long new credentials may take to be accepted (the NATS server reloads its users)."""


def load_enrollment(state_dir: Path) -> Enrolled | None:
    """The enrollment kept in ``state_dir``, or ``None`` if the agent never enrolled.

    Raises:
        ConfigError: the file exists but cannot be read.
    """
    path = state_dir / ENROLLMENT_FILE
    try:
        return msgspec.json.decode(path.read_bytes(), type=Enrolled)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{path}: unreadable enrollment ({exc}); remove it and enroll again") from None


def save_enrollment(state_dir: Path, enrolled: Enrolled) -> Path:
    """Keep ``enrolled`` in ``state_dir`` (atomically, owner-readable only); returns the file."""
    path = state_dir / ENROLLMENT_FILE
    write_private(path, msgspec.json.format(msgspec.json.encode(enrolled)) + b"\n")
    return path


class NotConnected(ConfigError):
    """No connection to the gateway could be opened: the token was not sent."""


async def enroll_through(gateways: str, token: str, state_dir: Path) -> Enrolled:
    """Enroll through the first of ``gateways`` (one URL, or several comma-separated) that accepts
    a connection. Only a connection that could not be opened moves on to the next: the token is used
    up once a gateway has it, so a request that may have arrived is never sent again.

    Raises:
        ConfigError: as :func:`enroll`; no gateway could be reached.
    """
    urls = [url.strip().rstrip("/") for url in gateways.split(",") if url.strip()]
    for url in urls[:-1]:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            try:
                return await enroll(client, token, state_dir)
            except NotConnected as exc:
                log.warning("%s; enrolling through the next gateway", exc.message)
    async with httpx.AsyncClient(base_url=urls[-1] if urls else gateways, timeout=30.0) as client:
        return await enroll(client, token, state_dir)


async def enroll(client: httpx.AsyncClient, token: str, state_dir: Path) -> Enrolled:
    """Enroll the agent of ``state_dir`` through the gateway ``client`` talks to, and save the result.

    Raises:
        ConfigError: the gateway refused the token (its message says why) or cannot be reached.
    """
    body = {"token": token.strip(), "worker_id": worker_id(state_dir), "hostname": socket.gethostname()}
    try:
        response = await client.post("/v1/agents/enroll", json=body)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise NotConnected(f"cannot reach the gateway at {client.base_url}: {exc}") from None
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the gateway at {client.base_url}: {exc}") from None
    if response.status_code != 201:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise ConfigError(f"enrollment refused ({response.status_code}): {message}")
    enrolled = msgspec.json.decode(response.content, type=Enrolled)
    path = save_enrollment(state_dir, enrolled)
    log.info(
        "enrolled as worker %s of provider %s; credentials in %s", enrolled.worker_id, enrolled.provider, path
    )
    return enrolled


def apply(enrolled: Enrolled, settings: AgentSettings, core: Settings) -> tuple[AgentSettings, Settings]:
    """The agent's settings as the enrollment says: its identity and its own NATS credentials."""
    replace = msgspec.structs.replace
    agent = replace(
        settings,
        provider=enrolled.provider,
        pool=enrolled.pool,
        region=enrolled.region,
        owner_tenant=enrolled.owner_tenant,
    )
    nats = enrolled.nats
    connection = replace(
        core,
        nats_url=nats.url,
        nats_creds=None,
        nats_user=nats.user,
        nats_password=nats.password,
        nats_inbox_prefix=nats.inbox_prefix,
        nats_js_api_prefix=nats.js_api_prefix,
    )
    return agent, connection


async def wait_until_accepted(core: Settings, timeout: float = ACTIVATION_TIMEOUT_S) -> None:
    """Return once NATS accepts the credentials in ``core`` (fresh ones need the server to reload).

    Raises:
        LogUnavailable: still refused after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            event_log = await EventLog.connect(core, name="resontech-agent-enroll-check")
        except LogUnavailable as exc:
            if time.monotonic() > deadline:
                raise LogUnavailable(
                    f"{exc.message}; enrolled credentials not accepted within {timeout:.0f}s "
                    "(is `resontech nats-auth` running beside the NATS server?)"
                ) from None
            await asyncio.sleep(0.5)
            continue
        await event_log.close()
        return
