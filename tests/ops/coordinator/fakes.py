"""Fakes of the coordinator parts' explicit dependencies, for unit tests without a server.

* :class:`Fold`: a read-only view of one projection, folded by the real reducer from events the
  test (or :class:`FakeLog`) stores, numbered like a stream;
* :class:`FakeLog`: the appender's log: it keeps what was appended (with the expected sequence and
  event id), raises what a test tells it to for a subject, refuses an append whose expected
  sequence is not the last of its filter (as JetStream does), and stores appends about a folded
  stream in that fold, applied when the test calls :meth:`Fold.catch_up` (as a projection applies
  them some time after the acknowledgement);
* :class:`FakePresigner`: signs without an object store; :class:`Ticks`: a clock the test moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConcurrencyConflict
from core.placement.placing import assignment_id
from core.streams import heartbeat_subject, job_subject, stream_for_subject, worker_subject
from core.wire import Position
from ops.coordinator.inputs import InputError, Presigner
from ops.coordinator.live_capacity import LiveCapacity
from ops.coordinator.views import Clock
from projections import ENDPOINTS, LIVENESS, REGISTRY, SCHEDULE, TENANTS
from projections.base import Projection
from projections.schedule import job_key
from schemas.envelope import Recorded
from schemas.jobs import JobResources, JobSubmitted
from schemas.values import Assignment, Gpu
from schemas.workers import Heartbeat, WorkerRegistered, WorkerVerified

S = 1_000_000_000
NOW = 1_800_000_000 * S
"""The tests' wall-clock time, nanoseconds."""


def matches(subject_filter: str, subject: str) -> bool:
    """Whether ``subject`` is under the NATS ``subject_filter`` (``*``: one token, ``>``: the rest)."""
    want, got = subject_filter.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or token not in ("*", got[i]):
            return False
    return len(want) == len(got)


class Fold:
    """One projection's state, folded from the events stored for it (a :class:`View`)."""

    def __init__(self, projection: Projection[Any]) -> None:
        self.projection = projection
        self.state: Any = projection.initial()
        self.seq = 0  # the last sequence stored (applied or not)
        self.stored: list[tuple[str, int]] = []  # (subject, sequence), applied or not
        self._pending: list[Recorded[Any]] = []

    def store(self, subject: str, event: Any, time_ns: int = NOW) -> int:
        """Store an event (applied at the next :meth:`catch_up`); its sequence."""
        self.seq += 1
        stream = self.projection.stream
        record = Recorded(
            stream=stream, seq=self.seq, subject=subject, time_ns=time_ns, msg_id=f"m{self.seq}", event=event
        )
        self._pending.append(record)
        self.stored.append((subject, self.seq))
        return self.seq

    def last_seq(self, subject_filter: str) -> int:
        """The sequence of the last event stored under ``subject_filter`` (0: none)."""
        return max((seq for subject, seq in self.stored if matches(subject_filter, subject)), default=0)

    def catch_up(self) -> None:
        """Apply every stored event, in order."""
        for record in self._pending:
            self.state = self.projection.evolve(self.state, record)
        self._pending = []

    def __call__(self, subject: str, event: Any, time_ns: int = NOW) -> None:
        """Store an event and apply it (with any stored before it)."""
        self.store(subject, event, time_ns)
        self.catch_up()


@dataclass(frozen=True)
class Append:
    """One acknowledged append."""

    subject: str
    event: Any
    expected_seq: int | None
    event_id: str | None


class FakeLog:
    """The appender's log (see the module docstring).

    Attributes:
        appended: the acknowledged appends, in order.
        refuse: subject prefix -> the error every append under it raises.
    """

    def __init__(self, *folds: Fold) -> None:
        self.folds = {fold.projection.stream: fold for fold in folds}
        self.appended: list[Append] = []
        self.refuse: dict[str, Exception] = {}
        self._other_seq = 0

    async def append(
        self,
        subject: str,
        event: Any,
        *,
        event_id: str | None = None,
        expected_seq: int | None = None,
        expected_filter: str | None = None,
    ) -> Position:
        for prefix, error in self.refuse.items():
            if subject.startswith(prefix):
                raise error
        stream = stream_for_subject(subject).name
        fold = self.folds.get(stream)
        last = fold.last_seq(expected_filter) if fold is not None and expected_filter is not None else None
        if expected_seq is not None and last is not None and last != expected_seq:
            raise ConcurrencyConflict(f"last {last}", subject=subject, expected=expected_seq)
        self.appended.append(Append(subject, event, expected_seq, event_id))
        if fold is not None:
            return Position(stream, fold.store(subject, event))
        self._other_seq += 1
        return Position(stream, self._other_seq)

    def events(self, of: type | None = None) -> list[Any]:
        """The events appended (only those of type ``of`` unless ``None``)."""
        return [a.event for a in self.appended if of is None or isinstance(a.event, of)]

    def to(self, prefix: str) -> list[Append]:
        """The appends whose subject starts with ``prefix``."""
        return [a for a in self.appended if a.subject.startswith(prefix)]


class FakePresigner(Presigner):
    """Signs every object without an object store; ``missing`` objects raise :class:`InputError`,
    and ``down`` makes every call fail as an unreachable store does."""

    def __init__(self, missing: Sequence[str] = ()) -> None:  # no client: nothing is reached
        self.missing = set(missing)
        self.down = False

    def url(self, bucket: str, key: str, *, put: bool = False, ttl_s: int = 3600) -> str:
        return f"https://store/{bucket}/{key}?{'put' if put else 'get'}"

    def downloads(self, tenant: str, inputs: Sequence[str]) -> dict[str, str]:
        if self.down:
            raise ConnectionError("object store unreachable")
        for name in inputs:
            if name in self.missing:
                raise InputError(f"no object at {name}")
        return {name: self.url(tenant, name) for name in inputs}

    async def downloads_async(self, tenant: str, inputs: Sequence[str]) -> dict[str, Any]:
        return self.downloads(tenant, inputs)


class Ticks:
    """A clock the test moves: wall time from :data:`NOW`, monotonic seconds from 1000."""

    def __init__(self) -> None:
        self.wall_ns = NOW
        self.monotonic = 1000.0

    def clock(self) -> Clock:
        return Clock(wall_ns=lambda: self.wall_ns, monotonic=lambda: self.monotonic)


class World:
    """The five projections the parts read, folded, and a :class:`FakeLog` that stores into them."""

    def __init__(self) -> None:
        self.registry, self.liveness = Fold(REGISTRY), Fold(LIVENESS)
        self.schedule, self.endpoints, self.tenants = Fold(SCHEDULE), Fold(ENDPOINTS), Fold(TENANTS)
        self.log = FakeLog(self.registry, self.liveness, self.schedule, self.endpoints, self.tenants)

    def catch_up(self) -> None:
        for fold in (self.registry, self.liveness, self.schedule, self.endpoints, self.tenants):
            fold.catch_up()

    def worker(
        self, worker_id: str, gpus: int = 1, vram_mb: int = 81920, running: Sequence[str] = ()
    ) -> None:
        """A verified worker with ``gpus`` idle GPUs, heartbeating (1 s interval) at :data:`NOW`."""
        cards = [
            Gpu(index=i, model="NVIDIA A100-SXM4-80GB", vram_total_mb=vram_mb, vram_free_mb=vram_mb)
            for i in range(gpus)
        ]
        registered = WorkerRegistered(provider="p", hostname=worker_id, gpus=cards, cpus=16, memory_mb=65536)
        self.registry(worker_subject(worker_id, registered), registered, NOW - 3600 * S)
        verified = WorkerVerified(challenge_id=f"c-{worker_id}")
        self.registry(worker_subject(worker_id, verified), verified, NOW - 3600 * S)
        self.beat(worker_id, running)

    def beat(self, worker_id: str, running: Sequence[str] = ()) -> None:
        """A heartbeat of ``worker_id`` at :data:`NOW`, its GPUs idle, running ``running``."""
        beat = Heartbeat(interval_s=1.0, running=list(running))
        self.liveness(heartbeat_subject(worker_id), beat, NOW)

    def job(self, job_id: str, tenant: str = "acme", **fields: Any) -> str:
        """Submit a job (one shard of one GPU unless ``fields`` say otherwise); its key."""
        given: dict[str, Any] = {
            "kind": "process",
            "shards": 1,
            "command": ["true"],
            "resources": JobResources(gpus=1),
        } | fields
        submitted = JobSubmitted(name=job_id, **given)
        self.schedule(job_subject(tenant, job_id, submitted), submitted)
        return job_key(tenant, job_id)

    def capacity(self) -> LiveCapacity:
        """The live capacity of the current states, as the coordinator's first step builds it."""
        return LiveCapacity.build(
            self.registry.state, self.liveness.state, self.schedule.state, self.endpoints.state, NOW
        )


def shard(job_id: str, slot: int, worker_id: str, epoch: int = 1, tenant: str = "acme") -> Assignment:
    """The assignment of ``slot`` of ``tenant``'s job ``job_id`` on ``worker_id``."""
    aid = assignment_id(job_id, slot, epoch, tenant=tenant, kind="job")
    return Assignment(assignment_id=aid, worker_id=worker_id, slot=slot, epoch=epoch, gpus=1)
