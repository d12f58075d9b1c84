"""The gateway's view of the kernel: the event log, the projections it reads, the key index.

One :class:`Kernel` per gateway process. It follows every projection it serves live (loading the
projector's snapshots first), so reads are served from memory; a write appends through
:class:`core.log.EventLog` and, when the caller needs to read its own write, waits until the
projection has applied it (:meth:`Kernel.append`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from core.log import EventLog
from core.objects import s3_client
from core.settings import Settings
from gateway.auth import KeyRecord
from gateway.errors import NotYetVisible
from gateway.feed import FeedHub
from gateway.references import SeenObjects
from gateway.settings import GatewaySettings
from projections import ENDPOINTS, LEDGER, LIVENESS, PROVIDERS, REGISTRY, SCHEDULE, TENANTS
from projections.base import Projection
from projections.runner import ProjectionRunner
from schemas._base import Event
from schemas.envelope import Recorded
from schemas.providers import ProviderKeyIssued, ProviderKeyRevoked
from schemas.tenants import ApiKeyIssued, ApiKeyRevoked

if TYPE_CHECKING:
    from core.wire import Position

log = logging.getLogger("resontech.gateway")
SERVED: tuple[Projection[Any], ...] = (TENANTS, PROVIDERS, REGISTRY, LIVENESS, SCHEDULE, ENDPOINTS, LEDGER)
"""The projections the gateway reads."""
READ_YOUR_WRITES_S = 5.0
"""How long a write waits for this gateway's projection to apply it before answering 202 instead."""


class AppendOptions(TypedDict, total=False):
    """The options of :meth:`core.log.EventLog.append` that :meth:`Kernel.append` passes on."""

    event_id: str | None
    expected_seq: int | None
    expected_filter: str | None


class Kernel:
    """Connections and live projections of one gateway process.

    Attributes:
        runners: projection name -> its live :class:`ProjectionRunner`.
        keys: key id -> :class:`KeyRecord`, kept current from TENANTS and PROVIDERS.
        s3: a boto3 client of the object store (blocking: call it through ``asyncio.to_thread``).
        feed: the live feed's fan-out (attached to the runners once they caught up).
        applied_at: projection name -> wall time (Unix s) this process last applied an event to it.
    """

    def __init__(self, settings: Settings, gateway: GatewaySettings) -> None:
        self.settings = settings
        self.gateway = gateway
        self.log: EventLog | None = None
        self.runners: dict[str, ProjectionRunner[Any]] = {}
        self.keys: dict[str, KeyRecord] = {}
        self.s3 = s3_client(
            settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key, region=settings.s3_region
        )
        self.seen_objects = SeenObjects()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.feed = FeedHub(gateway.feed_queue, gateway.feed_telemetry_s)
        self.applied_at: dict[str, float] = {}

    @property
    def event_log(self) -> EventLog:
        if self.log is None:
            raise RuntimeError("the kernel is not started")
        return self.log

    def state(self, projection: Projection[Any]) -> Any:
        """The current state of a served projection."""
        return self.runners[projection.name].state

    async def start(self, timeout: float = 60.0) -> None:
        """Connect, create missing streams, load and catch up every served projection."""
        self.log = await EventLog.connect(self.settings, name="resontech-gateway")
        await self.log.ensure_streams()
        for projection in SERVED:
            runner = ProjectionRunner(self.log, projection, write_snapshots=False)
            self.runners[projection.name] = runner
        self.runners[TENANTS.name].listeners.append(self._index_key)
        self.runners[PROVIDERS.name].listeners.append(self._index_key)
        for name, runner in self.runners.items():
            runner.listeners.append(self._stamp(name))
            self._tasks.append(
                asyncio.create_task(runner.run(self._stop), name=f"follow-{runner.projection.name}")
            )
        caught_up = asyncio.ensure_future(
            asyncio.gather(*(r.caught_up.wait() for r in self.runners.values()))
        )
        waiting: list[asyncio.Future[Any]] = [caught_up, *self._tasks]
        try:
            await asyncio.wait(waiting, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            caught_up.cancel()
        for task in self._tasks:
            if task.done():  # a runner only ends on its own when it failed
                raise RuntimeError(f"{task.get_name()} stopped") from task.exception()
        if not all(r.caught_up.is_set() for r in self.runners.values()):
            raise TimeoutError(f"projections did not catch up within {timeout:.0f} s")
        self.feed.attach(self.runners)

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 5.0)
        if self.log is not None:
            await self.log.close()

    def _stamp(self, name: str) -> Callable[[Recorded[Any]], None]:
        def stamp(_: Recorded[Any]) -> None:
            self.applied_at[name] = time.time()

        return stamp

    def _index_key(self, record: Recorded[Any]) -> None:
        event = record.event
        kind = "tenant" if record.subject.startswith("tenant.") else "provider"
        account = record.token(1)
        match event:
            case ApiKeyIssued(key_id=key_id, key_sha256=sha, role=role):
                self.keys[key_id] = KeyRecord(kind="tenant", account=account, role=role, key_sha256=sha)
            case ProviderKeyIssued(key_id=key_id, key_sha256=sha):
                self.keys[key_id] = KeyRecord(kind="provider", account=account, role="admin", key_sha256=sha)
            case ApiKeyRevoked(key_id=key_id) | ProviderKeyRevoked(key_id=key_id):
                old = self.keys.get(key_id)
                if old is not None and old.kind == kind and old.account == account:
                    self.keys[key_id] = KeyRecord(
                        kind=old.kind,
                        account=old.account,
                        role=old.role,
                        key_sha256=old.key_sha256,
                        revoked=True,
                    )
                    self.feed.revoke_key(key_id)  # an open feed is closed now, not at its next ping

    async def append(
        self,
        subject: str,
        event: Event,
        *,
        visible_in: Projection[Any] | None = None,
        **options: Unpack[AppendOptions],
    ) -> Position:
        """Append ``event`` (``options``: those of :meth:`core.log.EventLog.append`); with
        ``visible_in``, return only once that projection has applied it.

        Raises:
            NotYetVisible: the event is stored, but not applied within :data:`READ_YOUR_WRITES_S`.
        """
        position = await self.event_log.append(subject, event, **options)
        if visible_in is not None:
            await self.visible(visible_in, position)
        return position

    async def visible(self, projection: Projection[Any], position: Position) -> None:
        """Wait until ``projection`` has applied the event stored at ``position``.

        Raises:
            NotYetVisible: not within :data:`READ_YOUR_WRITES_S` (the event stays stored).
        """
        try:
            await self.runners[projection.name].wait_for(position.seq, READ_YOUR_WRITES_S)
        except TimeoutError:
            raise NotYetVisible(projection.name, position) from None

    async def stored_record(
        self, position: Position, subject: str, event: Event, event_id: str | None = None
    ) -> Recorded[Any]:
        """The record of an event appended at ``position`` on ``subject``, as the log holds it (with its
        store time); when the log cannot say at once, built from ``event`` with this clock's time."""
        try:
            stored = await self.event_log.get_last(position.stream, subject)
        except Exception as exc:  # best effort: only the store time is at stake
            log.warning(
                "reading back %s %d failed (%s): using the gateway's clock", subject, position.seq, exc
            )
            stored = None
        if stored is not None and stored.seq == position.seq:
            return stored
        return Recorded(
            stream=position.stream,
            seq=position.seq,
            subject=subject,
            time_ns=time.time_ns(),
            msg_id=event_id or "",
            event=event,
        )
