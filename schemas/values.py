"""Value objects, and groups of fields (:class:`schemas._base.Fields`), shared by several event families."""

from __future__ import annotations

from typing import Literal

from schemas._base import Fields, Value

Pool = Literal["shared", "managed", "private"]
"""The three GPU runtime pools: multi-tenant, reserved for one organisation, the owner's own."""

WorkKind = Literal["job", "endpoint"]
"""What a piece of placed work belongs to."""
WorkerState = Literal["available", "unverified", "cordoned", "lost", "deregistered"]
"""A worker's state in the registry: only ``available`` workers take new work."""
Sandboxing = Literal["bubblewrap", "off", "unavailable", ""]
"""How a worker's host isolates workloads (:class:`schemas.workers.WorkerRegistered`)."""


class Gpu(Value, frozen=True, kw_only=True):
    """One GPU of a worker, as NVML reports it at registration."""

    index: int
    model: str
    vram_total_mb: int
    vram_free_mb: int
    uuid: str = ""


class GpuTelemetry(Value, frozen=True, kw_only=True):
    """One GPU's readings in a heartbeat. ``None`` where NVML does not report a value."""

    index: int
    util_pct: float | None = None
    mem_used_mb: int | None = None
    temp_c: float | None = None
    power_w: float | None = None
    ecc_errors: int | None = None
    xid_errors: int | None = None


class ScoreCard(Value, frozen=True, kw_only=True):
    """The ranking of one candidate worker: the total score and the terms it is the product of."""

    worker_id: str
    score: float
    terms: dict[str, float] = {}


class Provenance(Value, frozen=True, kw_only=True):
    """Why a placement chose what it chose: the audit trail on every assignment.

    Attributes:
        candidates: workers considered.
        filtered: how many were filtered out, by reason (``vram``, ``pool``, ``cordoned``...).
        top: the best-ranked candidates with their score terms, best first.
        policy: the name and version of the placement policy that decided.
    """

    candidates: int
    filtered: dict[str, int] = {}
    top: list[ScoreCard] = []
    policy: str = "rank-v1"


class AssignmentRef(Fields, frozen=True, kw_only=True):
    """Which assignment: the identity every event about one assignment carries.

    Attributes:
        assignment_id: unique id of this placement (new on every re-placement).
        worker_id: the worker that runs it.
        slot: the shard index of a job or the replica index of an endpoint.
        epoch: fencing token; a higher epoch supersedes every older one for the same work.
    """

    assignment_id: str
    worker_id: str
    slot: int
    epoch: int


class Assignment(Value, AssignmentRef, frozen=True, kw_only=True):
    """One unit of placed work: a shard of a job or a replica of an endpoint on one worker (which
    one: :class:`AssignmentRef`).

    Attributes:
        gpus: GPUs the assignment occupies on the worker.
    """

    gpus: int = 0


class Placement(Fields, frozen=True, kw_only=True):
    """What one placement decision assigned, and why.

    Attributes:
        assignments: the work placed, one assignment per shard or replica.
        provenance: why the placement chose those workers.
    """

    assignments: list[Assignment]
    provenance: Provenance


class AssignmentRevocation(AssignmentRef, frozen=True, kw_only=True):
    """An assignment taken back, and why (``reason``)."""

    reason: str


class KeyIssue(Fields, frozen=True, kw_only=True):
    """An account's API key was issued. Only its SHA-256 (``key_sha256``) is stored; the key itself is
    shown once."""

    key_id: str
    key_sha256: str


class KeyRevocation(Fields, frozen=True, kw_only=True):
    """An account's API key stops working."""

    key_id: str
    revoked_by: str = ""
