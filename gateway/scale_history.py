"""An endpoint's replicas over the last hour, and the events that changed them, read from the log.

The replica counts are not this gateway's memory: they are the ENDPOINTS stream's events of the
endpoint (deployed, scaled, scaled to zero, replica placed, ready, lost, revoked, failed, deleted)
folded with the projection's own reducer (:func:`projections.endpoints.evolve`), so that a gateway
that restarted, or another gateway, draws the same history. After each event the endpoint's wanted
(``desired_replicas``) and ready replica counts are taken; a change of either is a step of the
series, and the scaling events (and a lost replica) are marks with a short label.

:class:`ScaleHistory` folds each endpoint once and keeps it: a read folds only the events stored
since the last one (a filtered read of the endpoint's own subjects, up to the sequence this
gateway's projection has applied), and none when nothing happened. The first read of an endpoint
folds its events since its deployment. Kept: :data:`MAX_ENDPOINTS` endpoints (the least recently
read forgotten first, to be folded again when read) and an hour of steps and marks each
(:data:`MAX_STEPS` at most: an endpoint that flaps keeps its latest).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.clock import NS_PER_S
from core.streams import endpoint_filter
from projections.endpoints import EndpointRecord, EndpointsState, endpoint_key, evolve, ready_replicas
from schemas.endpoints import (
    EndpointDeleted,
    EndpointDeployed,
    EndpointFailed,
    EndpointReplicaLost,
    EndpointScaled,
    EndpointScaledToZero,
)
from schemas.envelope import Recorded

if TYPE_CHECKING:
    from core.log import EventLog

HISTORY_S = 3600
"""How far back the steps and marks go."""
MAX_ENDPOINTS = 256
"""Endpoints whose folded history one gateway keeps."""
MAX_STEPS = 2000
"""Steps (and marks) kept per endpoint."""


@dataclass(frozen=True, slots=True)
class ReplicaStep:
    """From ``t`` (Unix seconds) on, the endpoint wanted ``wanted`` replicas and ``ready`` served."""

    t: float
    wanted: int
    ready: int


@dataclass(frozen=True, slots=True)
class ScaleMark:
    """An event that changed the endpoint's scale: ``kind`` is its tag, ``label`` what it did."""

    t: float
    seq: int
    kind: str
    label: str


def counts(endpoint: EndpointRecord | None) -> tuple[int, int]:
    """Wanted and ready replicas of ``endpoint`` (none before its deployment or after its deletion)."""
    if endpoint is None or endpoint.state == "deleted":
        return 0, 0
    return endpoint.desired_replicas, len(ready_replicas(endpoint))


def label_of(event: Any) -> str | None:
    """What a scaling event did, in a word or two (a chart's mark); ``None`` for an event that is no
    mark. The event itself says more: its reason, the inputs the autoscaler saw."""
    match event:
        case EndpointDeployed():
            return "deployed"
        case EndpointScaled(replicas=replicas, by=by):
            return "bounds set" if by else f"scaled to {replicas}"
        case EndpointScaledToZero():
            return "to zero"
        case EndpointReplicaLost():
            return "replica lost"
        case EndpointFailed():
            return "failed"
        case EndpointDeleted():
            return "deleted"
    return None


@dataclass(slots=True)
class Folded:
    """One endpoint's events folded up to ``seq``: its record, its steps and marks."""

    key: str
    seq: int
    state: EndpointsState = field(default_factory=EndpointsState)
    steps: deque[ReplicaStep] = field(default_factory=lambda: deque(maxlen=MAX_STEPS))
    marks: deque[ScaleMark] = field(default_factory=lambda: deque(maxlen=MAX_STEPS))
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def fold(self, recorded: Recorded[Any]) -> None:
        """Apply one of the endpoint's events (pure: the reducer, then a step and a mark if any)."""
        before = counts(self.state.endpoints.get(self.key))
        self.state = evolve(self.state, recorded)
        self.seq = max(self.seq, recorded.seq)
        t = recorded.time_ns / NS_PER_S
        after = counts(self.state.endpoints.get(self.key))
        if after != before or not self.steps:
            self.steps.append(ReplicaStep(t, *after))
        label = label_of(recorded.event)
        if label is not None:
            self.marks.append(ScaleMark(t, recorded.seq, type(recorded.event).event_tag(), label))

    def trim(self, now: float) -> None:
        """Forget what ended over :data:`HISTORY_S` ago (the step in force then stays)."""
        cutoff = now - HISTORY_S
        while len(self.steps) > 1 and self.steps[1].t <= cutoff:
            self.steps.popleft()
        while self.marks and self.marks[0].t < cutoff:
            self.marks.popleft()

    def window(self, since: float) -> tuple[list[ReplicaStep], list[ScaleMark]]:
        """The steps from ``since`` (the one in force then moved to ``since``) and the marks after it."""
        steps = [s for s in self.steps if s.t > since]
        earlier = [s for s in self.steps if s.t <= since]
        if earlier:
            steps.insert(0, ReplicaStep(since, earlier[-1].wanted, earlier[-1].ready))
        return steps, [m for m in self.marks if m.t >= since]


class ScaleHistory:
    """Folded histories of the endpoints read lately (see the module docstring)."""

    def __init__(self, max_endpoints: int = MAX_ENDPOINTS) -> None:
        self.folded: OrderedDict[str, Folded] = OrderedDict()
        self.max_endpoints = max_endpoints

    def _entry(self, endpoint: EndpointRecord) -> Folded:
        key = endpoint_key(endpoint.tenant, endpoint.endpoint_id)
        entry = self.folded.get(key)
        if entry is None:
            entry = self.folded[key] = Folded(key, endpoint.deployed_seq - 1)
        self.folded.move_to_end(key)
        while len(self.folded) > self.max_endpoints:
            self.folded.popitem(last=False)
        return entry

    async def window(
        self, log: EventLog, endpoint: EndpointRecord, now: float, window_s: float
    ) -> tuple[list[ReplicaStep], list[ScaleMark]]:
        """The endpoint's replica steps and scale marks over the last ``window_s`` seconds, its events
        read up to the last one this gateway applied (``endpoint.last_seq``)."""
        entry = self._entry(endpoint)
        async with entry.lock:
            if entry.seq < endpoint.last_seq:
                filtered = endpoint_filter(endpoint.tenant, endpoint.endpoint_id)
                replay = log.replay(
                    "ENDPOINTS", start_seq=entry.seq + 1, until_seq=endpoint.last_seq, subjects=filtered
                )
                async with contextlib.aclosing(replay) as records:
                    async for recorded in records:
                        entry.fold(recorded)
                entry.seq = max(entry.seq, endpoint.last_seq)
        entry.trim(now)
        return entry.window(now - window_s)
