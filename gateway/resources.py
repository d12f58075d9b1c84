"""A tenant's resources in the log (jobs, endpoints): created once, changed with the resource's
expected sequence, and shown as the projection will hold them when this gateway lags.

A resource is created by appending its first event with expected sequence 0 on its subjects, so its
id is taken once: a duplicate is a 409, and a retried request with the same ``Idempotency-Key``
answers with the resource it created (:mod:`gateway.idempotency`). Once the log has acknowledged an
event the answer is never a 5xx, which would invite a retry: if this gateway's projection has not
applied it within :data:`gateway.kernel.READ_YOUR_WRITES_S`, the answer is ``202 Accepted`` with the
resource as the projection will hold it (:meth:`Resource.as_applied`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from core.errors import ConcurrencyConflict
from core.streams import command_subject
from core.wire import Position
from gateway import idempotency
from gateway.api import Call, respond
from gateway.errors import ApiError, NotYetVisible, conflict, not_found
from gateway.idempotency import REPLAYED_HEADER
from gateway.paging import newest_first
from gateway.scope import scoped_tenant
from projections import Projection
from schemas._base import Event
from schemas.commands import StopWork
from schemas.envelope import Recorded
from schemas.values import WorkKind


class Record(Protocol):
    """What every resource record has: its tenant, and its latest sequence (the expected one for
    appends about it)."""

    @property
    def tenant(self) -> str: ...

    @property
    def last_seq(self) -> int: ...


class Assigned(Protocol):
    """One assignment of a piece of work (a job's shard, an endpoint's replica) to a worker."""

    @property
    def assignment_id(self) -> str: ...

    @property
    def worker_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


R = TypeVar("R", bound=Record)


@dataclass(frozen=True)
class Resource(Generic[R]):
    """How one kind of resource lives in the log and the API.

    Attributes:
        noun: what it is called in messages, ids and its path parameter (``job``, ``{job_id}``).
        id_prefix: the prefix of the ids the kernel chooses (``job``).
        projection: the live projection that holds its records.
        subject: its event subject, from tenant, id and event (or event type).
        subjects: the filter of all its subjects, from tenant and id.
        key: its key in the projection's table, from tenant and id.
        table: the records of a projection state, by key.
        alone: a projection state at a sequence holding the records given (one, or none).
        view: the API body of a record.
        sender: the field of its creation event that names who sent it: two creation events that
            differ only there ask for the same thing.
        exists: what a 409 for a taken id advises.
        reused: what a 422 for an ``Idempotency-Key`` sent with another request says.
    """

    noun: str
    id_prefix: str
    projection: Projection[Any]
    subject: Callable[[str, str, Any], str]
    subjects: Callable[[str, str], str]
    key: Callable[[str, str], str]
    table: Callable[[Any], dict[str, R]]
    alone: Callable[[int, dict[str, R]], Any]
    view: Callable[[R], msgspec.Struct]
    sender: str
    exists: str
    reused: str

    def named(self, call: Call[Any, Any], requested_id: str | None) -> tuple[str, str, str | None]:
        """The tenant, id and event id of a creation: the id requested, else one derived from the
        request's ``Idempotency-Key`` (or new); the event id only with a key."""
        tenant = scoped_tenant(call, call.query.tenant)
        key = idempotency.idempotency_key(call.request)
        resource_id = requested_id or idempotency.resource_id(self.id_prefix, tenant, key)
        return tenant, resource_id, idempotency.event_id(self.noun, tenant, resource_id, key)

    def listed(
        self, call: Call[Any, Any], keep: Callable[[R], bool], seq: Callable[[R], int]
    ) -> tuple[list[R], str | None]:
        """One page of the caller's tenant's resources that ``keep`` accepts, newest (highest
        ``seq``) first, after the query's cursor; and the next page's cursor."""
        q = call.query
        tenant = scoped_tenant(call, q.tenant)
        found = (
            r
            for r in self.table(call.kernel.state(self.projection)).values()
            if r.tenant == tenant and keep(r)
        )
        return newest_first(f"{self.noun}s", found, seq, q.after, q.limit)

    def visible(self, call: Call[Any, Any]) -> R:
        """The resource named in the path, in the caller's tenant; 404 otherwise."""
        tenant = scoped_tenant(call, call.query.tenant)
        resource_id = call.params[f"{self.noun}_id"]
        record = self.table(call.kernel.state(self.projection)).get(self.key(tenant, resource_id))
        if record is None:
            raise not_found(f"{self.noun} {resource_id}")
        return record

    def same(self, stored: Event, new: Event) -> bool:
        """True if two creation events ask for the same thing (who sent them aside)."""
        return stored == msgspec.structs.replace(new, **{self.sender: getattr(stored, self.sender)})

    def as_applied(self, known: R | None, record: Recorded[Any]) -> R:
        """The record as the projection will hold it once it applies ``record``, from ``known`` (or
        ``None`` for a creation): the pure reducer, on a state holding that record alone. Exact when
        ``record`` was appended with the expected sequence (nothing of it came in between)."""
        key = self.key(record.token(1), record.token(2))
        state = self.alone(known.last_seq if known else 0, {key: known} if known else {})
        return self.table(self.projection.evolve(state, record))[key]

    async def replay(
        self, call: Call[Any, Any], tenant: str, resource_id: str, event: Event, eid: str | None
    ) -> Any:
        """The answer when the id is taken: the same resource again for a retry of the request that
        created it (same ``Idempotency-Key``, same request; 202 while the projection has not applied
        it), else a 409."""
        stream = self.projection.stream
        stored = await call.kernel.event_log.get_last(stream, self.subject(tenant, resource_id, type(event)))
        if eid is None or stored is None or stored.msg_id != eid:
            raise conflict(f"{self.noun} {resource_id} exists; {self.exists}")
        if not self.same(stored.event, event):
            raise ApiError(422, "idempotency_key_reused", self.reused)
        call.resource = resource_id
        try:
            await call.kernel.visible(self.projection, Position(stored.stream, stored.seq))
            response = respond(self.view(self._now(call, tenant, resource_id)), 201)
        except NotYetVisible:
            response = respond(self.view(self.as_applied(None, stored)), 202)
        response.headers[REPLAYED_HEADER] = "true"
        return response

    async def create(
        self, call: Call[Any, Any], tenant: str, resource_id: str, event: Event, eid: str | None
    ) -> Any:
        """Append the creation ``event`` (the id taken once) and answer: 201 with the resource, 202
        while this gateway has not applied it, or the replay of an earlier attempt of the request."""
        subject = self.subject(tenant, resource_id, event)
        try:
            position = await call.kernel.append(
                subject,
                event,
                event_id=eid,
                expected_seq=0,
                expected_filter=self.subjects(tenant, resource_id),
                visible_in=self.projection,
            )
        except ConcurrencyConflict:
            return await self.replay(call, tenant, resource_id, event, eid)
        except NotYetVisible as pending:
            if pending.position.duplicate:  # a retry's first attempt stored it: same checks as any replay
                return await self.replay(call, tenant, resource_id, event, eid)
            call.resource = resource_id
            stored = await call.kernel.stored_record(pending.position, subject, event, eid)
            return respond(self.view(self.as_applied(None, stored)), 202)
        if position.duplicate:
            return await self.replay(call, tenant, resource_id, event, eid)
        call.resource = resource_id
        return self.view(self._now(call, tenant, resource_id))

    async def change(
        self, call: Call[Any, Any], known: R, tenant: str, resource_id: str, event: Event
    ) -> tuple[R, int] | None:
        """Append ``event`` with ``known``'s expected sequence: the record after it and 200, or 202
        when it is stored but this gateway has not applied it. ``None`` when something else of the
        resource was appended first: the record is then re-read (:meth:`fresh`) and decided again."""
        subject = self.subject(tenant, resource_id, event)
        try:
            await call.kernel.append(
                subject,
                event,
                expected_seq=known.last_seq,
                expected_filter=self.subjects(tenant, resource_id),
                visible_in=self.projection,
            )
        except ConcurrencyConflict:
            return None
        except NotYetVisible as pending:
            stored = await call.kernel.stored_record(pending.position, subject, event)
            return self.as_applied(known, stored), 202
        return self._now(call, tenant, resource_id), 200

    async def fresh(self, call: Call[Any, Any], tenant: str, resource_id: str) -> R:
        """The record once the projection has applied everything its stream holds now (503 when it
        lags: nothing of this request is stored)."""
        stream = self.projection.stream
        last = await call.kernel.event_log.last_seq(stream)
        try:
            await call.kernel.visible(self.projection, Position(stream, last))
        except NotYetVisible:
            raise ApiError(
                503, "busy", f"{self.noun} {resource_id} is changing and this gateway lags; retry"
            ) from None
        return self._now(call, tenant, resource_id)

    def _now(self, call: Call[Any, Any], tenant: str, resource_id: str) -> R:
        return self.table(call.kernel.state(self.projection))[self.key(tenant, resource_id)]


async def stop_work(
    call: Call[Any, Any],
    work: tuple[str, WorkKind, str],
    assigned: Iterable[Assigned],
    reason: str,
    command: str,
) -> None:
    """Tell each agent holding one of the ``assigned`` of ``work`` (``(tenant, kind, work_id)``) to
    stop it; the command id (``<command>-<assignment id>``) makes a retry store nothing twice, and
    the stop names its tenant and kind (the agent stops only that tenant's work)."""
    tenant, kind, work_id = work
    for a in assigned:
        stop = StopWork(
            work_id=work_id,
            assignment_id=a.assignment_id,
            epoch=a.epoch,
            reason=reason,
            tenant=tenant,
            work_kind=kind,
        )
        await call.kernel.event_log.append(
            command_subject(a.worker_id), stop, event_id=f"{command}-{a.assignment_id}"
        )
