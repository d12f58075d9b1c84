"""Projection snapshots, kept in JetStream's object store (bucket ``snapshots``) beside the streams
they were folded from."""

from __future__ import annotations

import nats.js.errors

from core.log.connection import LogConnection

SNAPSHOT_BUCKET = "snapshots"


class Snapshots(LogConnection):
    """The snapshot store of :class:`core.log.EventLog`."""

    async def put_snapshot(self, name: str, data: bytes) -> None:
        """Store a projection snapshot (JetStream object store, bucket ``snapshots``)."""
        store = await self._js.object_store(SNAPSHOT_BUCKET)
        await store.put(name, data)

    async def get_snapshot(self, name: str) -> bytes | None:
        """The stored snapshot called ``name``, or ``None``."""
        try:
            store = await self._js.object_store(SNAPSHOT_BUCKET)
            result = await store.get(name)
        except (nats.js.errors.NotFoundError, nats.js.errors.ObjectNotFoundError):
            return None
        return bytes(result.data or b"")
