"""Setting up the deployment: every stream of :mod:`core.streams`'s table created on the server, or
its configuration brought up to date, and the bucket projection snapshots are stored in: a plain
function on a JetStream context, which :meth:`core.log.EventLog.ensure_streams` calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext, api

from core.errors import LogUnavailable
from core.log.snapshots import SNAPSHOT_BUCKET
from core.streams import DUPLICATE_WINDOW_S, StreamSpec

STREAM_CREATE_ATTEMPTS = 12
STREAM_STORE_ERROR = 10049
"""JetStream's "error creating store for stream"."""
NO_PEERS_ERROR = 10005
"""JetStream's "no suitable peers for placement": a cluster whose nodes the meta leader does not yet
all see online (just started, or one restarting) cannot place an R3 stream yet."""


async def ensure_streams(js: JetStreamContext, streams: Sequence[StreamSpec], *, replicas: int) -> None:
    """Create every stream of ``streams`` with ``replicas`` replicas, or update its configuration to
    the table; then the snapshot bucket (:data:`~core.log.snapshots.SNAPSHOT_BUCKET`), if missing.

    A stream's persist mode is fixed at its creation (the server refuses to change it): an existing
    stream keeps the one it has.

    Raises:
        LogUnavailable: JetStream is not available.
    """
    for spec in streams:
        config = _stream_config(spec, replicas)
        try:
            await _add_stream(js, config)
        except nats.js.errors.BadRequestError:
            existing = await js.stream_info(spec.name)
            config.persist_mode = existing.config.persist_mode
            if config.persist_mode == api.PersistMode.ASYNC:
                config.allow_atomic = None  # refused together
            await js.update_stream(config)
        except nats.js.errors.ServiceUnavailableError as exc:
            raise LogUnavailable(f"JetStream is not available: {exc}") from None
    with contextlib.suppress(nats.js.errors.BadRequestError):
        await js.create_object_store(SNAPSHOT_BUCKET, config=api.ObjectStoreConfig(replicas=replicas))


async def _add_stream(jsm: Any, config: api.StreamConfig) -> None:
    """Create a stream; what the server cannot do yet is tried again, for up to ~8 s: a store it
    cannot create (10049: the directory of a stream deleted a moment ago is still being removed),
    replicas it cannot place (10005: a cluster's node not yet seen online)."""
    for attempt in range(STREAM_CREATE_ATTEMPTS):
        try:
            await jsm.add_stream(config)
            return
        except nats.js.errors.APIError as exc:
            not_yet = exc.err_code in (STREAM_STORE_ERROR, NO_PEERS_ERROR)
            if not not_yet or attempt == STREAM_CREATE_ATTEMPTS - 1:
                raise
        await asyncio.sleep(0.1 * (attempt + 1))


def _stream_config(spec: StreamSpec, replicas: int) -> api.StreamConfig:
    return api.StreamConfig(
        name=spec.name,
        description=spec.holds,
        subjects=list(spec.subjects) or None,
        retention=api.RetentionPolicy.WORK_QUEUE
        if spec.retention == "workqueue"
        else api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        num_replicas=replicas,
        max_age=float(spec.max_age_s),
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_msg_size=spec.max_msg_bytes,
        duplicate_window=float(DUPLICATE_WINDOW_S),
        sources=[api.StreamSource(name=s) for s in spec.sources] or None,
        allow_direct=True,
        persist_mode=api.PersistMode.ASYNC if spec.persist_async and replicas == 1 else None,
        # group commit (core.log.group_commit); the server refuses it beside persist_mode async
        allow_atomic=True if spec.atomic and not (spec.persist_async and replicas == 1) else None,
    )
