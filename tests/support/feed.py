"""Helpers for tests of the live feed against a served gateway: a client connected past its
``feed.ready`` (:func:`open_feed`), one message read with a deadline (:func:`recv`), and events appended
straight to the log for the feed to carry (:func:`submit`, :func:`progress`; each returns the record's
stream sequence)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from core.log import EventLog
from core.streams import job_subject
from gateway.wsclient import WebSocket, connect
from schemas.jobs import JobProgress, JobSubmitted
from tests.support.gateway import GatewayServer


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def recv(ws: WebSocket, timeout: float = 15.0) -> dict[str, Any]:
    message = json.loads(await asyncio.wait_for(ws.recv(), timeout))
    assert isinstance(message, dict)
    return message


async def open_feed(
    server: GatewayServer, key: str, query: str = "", *, header: bool = True, **options: Any
) -> WebSocket:
    """A connected feed, past its ``feed.ready`` (unless it replays with ``after``: that comes first)."""
    ws = await connect(f"{server.ws_url}/v1/feed{query}", auth(key) if header else None, **options)
    if not header:
        await ws.send(json.dumps({"kind": "auth", "key": key}))
    if "after=" not in query:
        ready = await recv(ws)
        assert ready["kind"] == "feed.ready", ready
    return ws


async def submit(log: EventLog, tenant: str, job: str) -> int:
    event = JobSubmitted(name=job, kind="process", shards=1)
    return (await log.append(job_subject(tenant, job, event), event)).seq


async def progress(log: EventLog, tenant: str, job: str, step: int, **extra: Any) -> int:
    event = JobProgress(epoch=1, step=step, loss=1.0 / (step + 1), **extra)
    return (await log.append(job_subject(tenant, job, event), event)).seq
