"""Projection snapshots, kept in JetStream's object store (bucket ``snapshots``) beside the streams
they were folded from: plain functions on a JetStream context, which
:meth:`core.log.EventLog.put_snapshot` and :meth:`~core.log.EventLog.get_snapshot` call."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext

SNAPSHOT_BUCKET = "snapshots"


async def put_snapshot(js: JetStreamContext, name: str, data: bytes) -> None:
    """Store ``data`` as the snapshot called ``name`` (replacing the one stored before)."""
    store = await js.object_store(SNAPSHOT_BUCKET)
    await store.put(name, data)


async def get_snapshot(js: JetStreamContext, name: str) -> bytes | None:
    """The stored snapshot called ``name``, or ``None``."""
    try:
        store = await js.object_store(SNAPSHOT_BUCKET)
        result = await store.get(name)
    except (nats.js.errors.NotFoundError, nats.js.errors.ObjectNotFoundError):
        return None
    return bytes(result.data or b"")
