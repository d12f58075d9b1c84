"""The live feed's fan-out: one subscription per stream, shared by every WebSocket client of a process.

The gateway already follows JOBS, ENDPOINTS and HEARTBEATS live for its projections (SCHEDULE,
ENDPOINTS, LIVENESS). :class:`FeedHub` listens to those runners, so the feed costs no extra NATS
consumer however many clients connect: each event is matched against the subscribers of its tenant
(the tenant is the subject's second token, so another tenant's events are never even looked at),
encoded once, and appended to each matching subscriber's bounded queue. A subscriber whose queue is
full is closed as too slow, never buffered further. Replays for ``after`` read the stream directly
(:meth:`core.log.EventLog.replay`); the WebSocket session that ties replay and live together is in
:mod:`gateway.routes.feed`, and :data:`PROTOCOL` is the contract clients (the SDK, the dashboard)
rely on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from gateway.feed_filter import (
    TELEMETRY,
    FeedFilter,
    format_cursor,
)
from projections import ENDPOINTS, LIVENESS, REGISTRY, SCHEDULE
from projections.endpoints import endpoint_key
from projections.liveness import registered_readings
from projections.runner import ProjectionRunner
from projections.schedule import TERMINAL, job_key
from schemas.api.feed import FeedError, FeedMessage, FeedTelemetry
from schemas.endpoints import (
    EndpointDeleted,
    EndpointReplicaPlaced,
    EndpointReplicaReady,
    EndpointReplicaRevoked,
    EndpointScaledToZero,
)
from schemas.envelope import Recorded
from schemas.jobs import (
    JobAssignmentRevoked,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobSubmitted,
)
from schemas.values import GpuTelemetry
from schemas.workers import Heartbeat

PROTOCOL = """\
## Live feed: `WebSocket /v1/feed`

Your tenant's events as JSON text messages, live, resumable. (A plain HTTP `GET /v1/feed` answers 426.)

**Authenticate** with `Authorization: Bearer rt_...` on the handshake, or (browsers cannot set
headers) send `{"kind": "auth", "key": "rt_..."}` as the first message within 10 s. Never put a key
in the URL: a `key` query parameter is refused. The operator names the tenant with `?tenant=`.

**Query parameters**: `after=jobs:<seq>,endpoints:<seq>` resumes after that cursor (a stream left out
starts live; without `after` the feed starts live); `job=<id>[,<id>...]`, `endpoint=<id>[,...]`
(with both, events of either); `kind=<kind>[,...]` where a kind is an event tag (`job.progress`), a
family (`job`, `endpoint`) or `telemetry`.

**Messages** (`kind` says which):
- an event: `{"seq", "stream": "JOBS"|"ENDPOINTS", "subject", "time", "kind": "job.progress",
  "tenant", "job"|"endpoint", "event": {...}}`; `seq` is the stream sequence. Events of one stream
  arrive in sequence order; JOBS and ENDPOINTS events interleave in no guaranteed order.
- `telemetry`: a worker running your work, at most once per worker every few seconds, live only:
  `{"seq", "stream": "HEARTBEATS", "worker", "jobs", "endpoints", "event": {"gpus": [...]}}`; only
  from the worker the kernel placed the work on, and only readings of the GPUs it registered.
- `feed.ready`: replay is over, live events follow; `cursor` is the position reached.
- `feed.ping`: after 20 s without a message; `cursor` is the position reached. A client that hears
  nothing for a minute should assume the connection is dead and reconnect.
- `feed.error`: `{"error": {"code", "message"}}`, just before a close.

**Resuming**: keep, per stream, the `seq` of the last event received (and take `cursor` from
`feed.ready` / `feed.ping`, which also advance past events your filters skip); reconnect with
`after=jobs:<seq>,endpoints:<seq>` and the same filters. The gateway replays what you missed from the
log, then continues live: no event is missed and none is sent twice. A cursor beyond the end of
the log is refused (4400).

**Close codes**: 4000 + the HTTP status the problem would get: 4400 bad query or message (the
reason says what to fix), 4401 missing, unknown or revoked key (a key revoked while its feed is
open closes it within a second, busy or idle, with `feed.error` code `key_revoked`; no event is sent
after the gateway applied the revocation), 4403 a provider key, 4404 another tenant; 4008 too slow
(your queue of unsent messages filled up: reconnect with the `after` in the reason); 1011 the event
log is unreachable; 1006 (no close frame) the connection dropped, e.g. the gateway restarted. After
1011 or 1006 reconnect with your cursor, backing off. Nothing is ever sent before authentication
succeeds.
"""

TOO_SLOW = 4008
KEY_REVOKED = 4401
_JOB_PLACEMENT = (JobPlaced, JobAssignmentRevoked, JobCompleted, JobFailed, JobCancelled)
_ENDPOINT_PLACEMENT = (EndpointReplicaPlaced, EndpointReplicaRevoked, EndpointScaledToZero, EndpointDeleted)
_ENCODE = msgspec.json.Encoder().encode

Owner = tuple[str, str, str]
"""(tenant, ``job`` or ``endpoint``, id): whose work an assignment is, as the schedule names it."""
Held = tuple[str, str]
"""(worker id, assignment id): an assignment the schedule says a worker holds."""


def iso(ns: int) -> str:
    """Unix nanoseconds as ISO 8601 UTC with milliseconds."""
    moment = dt.datetime.fromtimestamp(ns / 1e9, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Subscriber:
    """One client's bounded queue of encoded messages, and how far it has been sent.

    Attributes:
        pending: ``(stream, seq, text)`` not yet sent, at most ``limit``.
        sent: stream -> sequence of the last event sent (or skipped as matched by nothing up to it).
        closing: ``(code, reason)`` once the hub dropped the client; the session closes with it.
        error: the ``feed.error`` code to close with (default: the close code's, see
            :data:`gateway.routes.feed.ERROR_CODES`).
        key_id: the API key the client authenticated with (its revocation closes the feed).
    """

    __slots__ = ("closed", "closing", "error", "filter", "key_id", "limit", "pending", "sent", "wake")

    def __init__(self, feed_filter: FeedFilter, limit: int, key_id: str = "") -> None:
        self.filter = feed_filter
        self.limit = limit
        self.key_id = key_id
        self.error: str | None = None
        self.pending: deque[tuple[str, int, str]] = deque()
        self.wake = asyncio.Event()
        self.closing: tuple[int, str] | None = None
        self.closed = asyncio.Event()
        self.sent: dict[str, int] = {}

    def offer(self, stream: str, seq: int, text: str) -> bool:
        """Queue one message; ``False`` (and nothing queued) when the queue is full."""
        if self.closing is not None:
            return True
        if len(self.pending) >= self.limit:
            return False
        self.pending.append((stream, seq, text))
        self.wake.set()
        return True

    def close(self, code: int, reason: str, error: str | None = None) -> None:
        """Drop what is queued (freeing it now) and ask the session to close."""
        if self.closing is None:
            self.closing = (code, reason)
            self.error = error
        self.pending.clear()
        self.wake.set()
        self.closed.set()

    def cursor(self) -> str:
        return format_cursor(self.sent)


REDACTED = "<redacted>"


def shown(event: Any) -> Any:
    """An event as the feed shows it: a job's environment values masked, as ``GET
    /v1/jobs/{job_id}/events`` masks them (a viewer key must not read the secrets a member passed),
    and a ready replica without its key (the kernel's, to call it: a tenant that held it could call the
    engine past the gateway, unmetered). This is the one place endpoint events reach a tenant."""
    if isinstance(event, JobSubmitted) and event.env:
        return msgspec.structs.replace(event, env=dict.fromkeys(event.env, REDACTED))
    if isinstance(event, EndpointReplicaReady):
        body = msgspec.to_builtins(event)
        del body["api_key"]
        return body
    return event


def event_text(record: Recorded[Any], tenant: str, what: str, ident: str) -> str:
    """The feed message of a JOBS or ENDPOINTS event, as sent."""
    message = FeedMessage(
        kind=record.event.event_tag(),
        seq=record.seq,
        stream=record.stream,
        subject=record.subject,
        time=iso(record.time_ns),
        tenant=tenant,
        job=ident if what == "job" else None,
        endpoint=ident if what == "endpoint" else None,
        event=shown(record.event),
    )
    return _ENCODE(message).decode()


def control_text(kind: str, cursor: str | None = None, error: FeedError | None = None) -> str:
    """A ``feed.*`` message."""
    return _ENCODE(FeedMessage(kind=kind, time=iso(time.time_ns()), cursor=cursor, error=error)).decode()


class FeedHub:
    """Fans the gateway's live JOBS, ENDPOINTS and HEARTBEATS records out to feed subscribers.

    Args:
        queue_size: each subscriber's queue bound (``RESONTECH_GATEWAY_FEED_QUEUE``).
        telemetry_s: the least interval between two ``telemetry`` messages of one worker.

    Attributes:
        sent: messages handed to clients (counted by the sessions).
        dropped: clients closed as too slow.
    """

    def __init__(self, queue_size: int = 1000, telemetry_s: float = 5.0) -> None:
        self.queue_size = queue_size
        self.telemetry_s = telemetry_s
        self.sent = 0
        self.dropped = 0
        self._by_tenant: dict[str, set[Subscriber]] = {}
        self._by_key: dict[str, set[Subscriber]] = {}
        self._runners: dict[str, ProjectionRunner[Any]] = {}
        self._registry: ProjectionRunner[Any] | None = None
        self._held: dict[str, dict[str, set[Owner]]] = {}  # worker -> assignment id -> owners
        self._work: dict[Owner, frozenset[Held]] = {}
        self._beat_sent: dict[str, float] = {}

    # -- wiring -----------------------------------------------------------------------------------

    def attach(self, runners: Mapping[str, ProjectionRunner[Any]]) -> None:
        """Listen to the kernel's live runners; the assignment index starts from their current state."""
        jobs, endpoints = runners[SCHEDULE.name], runners[ENDPOINTS.name]
        self._runners = {"JOBS": jobs, "ENDPOINTS": endpoints}
        self._registry = runners.get(REGISTRY.name)
        for job in jobs.state.jobs.values():
            self._index_job(job.tenant, job.job_id)
        for endpoint in endpoints.state.endpoints.values():
            self._index_endpoint(endpoint.tenant, endpoint.endpoint_id)
        jobs.listeners.append(self._on_job)
        endpoints.listeners.append(self._on_endpoint)
        runners[LIVENESS.name].listeners.append(self._on_beat)

    def positions(self) -> dict[str, int]:
        """Stream -> the last sequence this process has applied (and so fanned out)."""
        return {stream: runner.seq for stream, runner in self._runners.items()}

    def subscribe(self, subscriber: Subscriber) -> dict[str, int]:
        """Start delivering live events to ``subscriber``; returns :meth:`positions` at this instant,
        so that every later event has a higher sequence."""
        self._by_tenant.setdefault(subscriber.filter.tenant, set()).add(subscriber)
        return self.positions()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop delivering to ``subscriber`` (and watching its key)."""
        for index, name in ((self._by_tenant, subscriber.filter.tenant), (self._by_key, subscriber.key_id)):
            subscribers = index.get(name)
            if subscribers is not None:
                subscribers.discard(subscriber)
                if not subscribers:
                    del index[name]

    def watch_key(self, subscriber: Subscriber) -> None:
        """Close ``subscriber`` when its key is revoked (from the moment it authenticated, replay
        included; :meth:`unsubscribe` ends it)."""
        self._by_key.setdefault(subscriber.key_id, set()).add(subscriber)

    def revoke_key(self, key_id: str) -> int:
        """Close every feed of ``key_id`` now, with 4401 ``key_revoked``: nothing queued for them is
        sent, and nothing more is queued. Returns how many were closed."""
        closed = list(self._by_key.pop(key_id, ()))
        for subscriber in closed:
            self.unsubscribe(subscriber)
            subscriber.close(KEY_REVOKED, f"API key {key_id} was revoked", "key_revoked")
        return len(closed)

    @property
    def subscribers(self) -> int:
        return sum(len(s) for s in self._by_tenant.values())

    # -- fan-out ----------------------------------------------------------------------------------

    def _offer(self, subscriber: Subscriber, stream: str, seq: int, text: str) -> None:
        if not subscriber.offer(stream, seq, text):
            self.dropped += 1
            self.unsubscribe(subscriber)
            subscriber.close(TOO_SLOW, f"too slow: reconnect with after={subscriber.cursor()}")

    def _fan_out(self, record: Recorded[Any], tenant: str, what: str, ident: str) -> None:
        subscribers = self._by_tenant.get(tenant)
        if not subscribers:
            return
        kind = record.event.event_tag()
        text = None
        for subscriber in list(subscribers):
            if subscriber.filter.wants_event(record.stream, kind, ident):
                text = text or event_text(record, tenant, what, ident)
                self._offer(subscriber, record.stream, record.seq, text)

    def _on_job(self, record: Recorded[Any]) -> None:
        tenant, job_id = record.token(1), record.token(2)
        if isinstance(record.event, _JOB_PLACEMENT):
            self._index_job(tenant, job_id)
        self._fan_out(record, tenant, "job", job_id)

    def _on_endpoint(self, record: Recorded[Any]) -> None:
        tenant, endpoint_id = record.token(1), record.token(2)
        if isinstance(record.event, _ENDPOINT_PLACEMENT):
            self._index_endpoint(tenant, endpoint_id)
        self._fan_out(record, tenant, "endpoint", endpoint_id)

    def _on_beat(self, record: Recorded[Any]) -> None:
        beat = record.event
        if not self._by_tenant or not isinstance(beat, Heartbeat):
            return
        worker = record.token(1)
        owners = self.owners(worker, beat.running)
        if not any(tenant in self._by_tenant for tenant, _, _ in owners):
            return
        now = time.monotonic()
        if now - self._beat_sent.get(worker, -math.inf) < self.telemetry_s:
            return
        self._beat_sent[worker] = now
        work: dict[str, tuple[list[str], list[str]]] = {}
        for tenant, what, ident in sorted(set(owners)):
            jobs, endpoints = work.setdefault(tenant, ([], []))
            (jobs if what == "job" else endpoints).append(ident)
        readings = FeedTelemetry(
            gpus=self._believed_gpus(worker, beat), cpu_pct=beat.cpu_pct, memory_used_mb=beat.memory_used_mb
        )
        for tenant, (jobs, endpoints) in work.items():
            text = None
            for subscriber in list(self._by_tenant.get(tenant, ())):
                if subscriber.filter.wants_telemetry(jobs, endpoints):
                    text = text or _telemetry_text(record, tenant, worker, jobs, endpoints, readings)
                    self._offer(subscriber, record.stream, record.seq, text)

    # -- whose work each worker holds (for telemetry) ------------------------------------------
    #
    # A beat's ``running`` is its agent's word: it names assignment ids, and an agent may name any.
    # Telemetry goes to an owner only for an assignment the schedule (or the endpoint table) says
    # this very worker holds now; the owner is the (tenant, job or endpoint) the schedule itself
    # files the assignment under, never read off the id, so it is right whatever an id looks like.

    def owners(self, worker_id: str, running: Iterable[str]) -> set[Owner]:
        """The owners of the assignments of ``running`` that the schedule says ``worker_id`` holds.
        An id two owners' assignments share on one worker names neither (the beat cannot say whose
        work it ran)."""
        held = self._held.get(worker_id)
        if not held:
            return set()
        found: set[Owner] = set()
        for assignment_id in running:
            owners = held.get(assignment_id)
            if owners is not None and len(owners) == 1:
                found |= owners
        return found

    def _believed_gpus(self, worker_id: str, beat: Heartbeat) -> list[GpuTelemetry]:
        """The beat's GPU readings of the GPUs the worker registered (none without a registry)."""
        record = None if self._registry is None else self._registry.state.workers.get(worker_id)
        return registered_readings(beat.gpus, record.registration.gpus if record is not None else [])

    def _index(self, owner: Owner, current: frozenset[Held]) -> None:
        for worker_id, assignment_id in self._work.pop(owner, frozenset()) - current:
            held = self._held.get(worker_id, {})
            owners = held.get(assignment_id, set())
            owners.discard(owner)
            if not owners:
                held.pop(assignment_id, None)
            if not held:
                self._held.pop(worker_id, None)
        for worker_id, assignment_id in current:
            self._held.setdefault(worker_id, {}).setdefault(assignment_id, set()).add(owner)
        if current:
            self._work[owner] = current

    def _index_job(self, tenant: str, job_id: str) -> None:
        job = self._runners["JOBS"].state.jobs.get(job_key(tenant, job_id))
        live = job is not None and job.state not in TERMINAL
        assignments = job.assignments.values() if live and job else ()
        self._index((tenant, "job", job_id), frozenset((a.worker_id, a.assignment_id) for a in assignments))

    def _index_endpoint(self, tenant: str, endpoint_id: str) -> None:
        endpoint = self._runners["ENDPOINTS"].state.endpoints.get(endpoint_key(tenant, endpoint_id))
        live = endpoint is not None and endpoint.state != "deleted"
        replicas = endpoint.replicas.values() if live and endpoint else ()
        held = frozenset((r.worker_id, r.assignment_id) for r in replicas)
        self._index((tenant, "endpoint", endpoint_id), held)


def _telemetry_text(
    record: Recorded[Any],
    tenant: str,
    worker: str,
    jobs: list[str],
    endpoints: list[str],
    readings: FeedTelemetry,
) -> str:
    message = FeedMessage(
        kind=TELEMETRY,
        seq=record.seq,
        stream=record.stream,
        subject=record.subject,
        time=iso(record.time_ns),
        tenant=tenant,
        worker=worker,
        jobs=jobs,
        endpoints=endpoints,
        event=readings,
    )
    return _ENCODE(message).decode()
