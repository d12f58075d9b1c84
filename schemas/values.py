"""Value objects, and groups of fields (:class:`schemas._base.Fields`), shared by several event families."""

from __future__ import annotations

from typing import Literal

from msgspec.structs import force_setattr

from schemas._base import Fields, Value

Pool = Literal["shared", "managed", "private"]
"""The three GPU runtime pools: multi-tenant, reserved for one organisation, the owner's own."""

WorkKind = Literal["job", "endpoint"]
"""What a piece of placed work belongs to."""
WorkerState = Literal["available", "unverified", "cordoned", "lost", "deregistered"]
"""A worker's state in the registry: only ``available`` workers take new work."""
Sandboxing = Literal["bubblewrap", "kubernetes", "off", "unavailable", ""]
"""How a worker's host isolates workloads (:class:`schemas.workers.WorkerRegistered`)."""

TopologyLevel = Literal["clique", "switch", "rack", "block", "zone"]
"""A level of the network's domains (:data:`TOPOLOGY_LEVELS`)."""
TOPOLOGY_LEVELS: tuple[TopologyLevel, ...] = ("clique", "switch", "rack", "block", "zone")
"""The levels of network domains, narrowest first: an NVLink domain (NVML's fabric clique, Kubernetes'
``nvidia.com/gpu.clique``), a leaf switch, a rack, a block (what one spine reaches), a zone."""
TOPOLOGY_VALUE = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
"""A domain's name at one level, as a worker reports it."""


class TopologyRequest(Value, frozen=True, kw_only=True):
    """A gang's wish to share a network domain (:mod:`core.placement.topology`).

    Attributes:
        level: the domain's level (:data:`TOPOLOGY_LEVELS`).
        mode: ``required`` (every shard in one domain of ``level``, or wait), or ``preferred`` (one
            domain of ``level`` if one has room, else of the next wider level, else anywhere).
    """

    level: TopologyLevel
    mode: Literal["required", "preferred"] = "required"


IMAGE_PATTERN = (
    r"^(?:[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?::[0-9]{1,5})?/)?"  # registry host[:port]/
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"  # path
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
"""A plain OCI image reference, ``[registry[:port]/]path[:tag][@sha256:digest]``: nothing a container
runtime or a manifest could read as anything else."""
MAX_IMAGE_LENGTH = 512


class Gpu(Value, frozen=True, kw_only=True):
    """One GPU of a worker, as NVML reports it at registration."""

    index: int
    model: str
    vram_total_mb: int
    vram_free_mb: int
    uuid: str = ""


MAX_GPU_MEMORY_MB = 1 << 24
"""16 TiB: more memory than any GPU has; a reading above it is no reading."""
MAX_GPU_POWER_W = 10_000.0
MIN_GPU_TEMP_C, MAX_GPU_TEMP_C = -50.0, 200.0
MAX_ERROR_COUNT = 1_000_000_000
"""Error counts above it are read as it: still errors (the health controller cordons on any), and a
number every sum and chart can hold."""


class GpuTelemetry(Value, frozen=True, kw_only=True):
    """One GPU's readings in a heartbeat. ``None`` where NVML does not report a value.

    A heartbeat is its agent's word (agents publish their own beats, unjudged), so every reading is
    bounded where it is decoded (and built): a reading outside its range (a utilisation outside 0 to
    100, a negative or impossible size, power or temperature, NaN or an infinity) becomes ``None``,
    as if NVML had not reported it; an error count above :data:`MAX_ERROR_COUNT` becomes that count.
    Dropping one field keeps the rest of the beat, which is still a sign of life.

    Attributes:
        index: the GPU's NVML index (matched against the GPUs the worker registered).
        util_pct: percent, 0 to 100. mem_used_mb: MiB, 0 to :data:`MAX_GPU_MEMORY_MB`.
        temp_c: degrees Celsius, -50 to 200. power_w: watts, 0 to 10,000.
        ecc_errors / xid_errors: counts, 0 to :data:`MAX_ERROR_COUNT`.
    """

    index: int
    util_pct: float | None = None
    mem_used_mb: int | None = None
    temp_c: float | None = None
    power_w: float | None = None
    ecc_errors: int | None = None
    xid_errors: int | None = None

    def __post_init__(self) -> None:
        # the common case (every reading in range) costs a few comparisons; chained comparisons are
        # False for NaN, so NaN is out of range too
        if self.util_pct is not None and not 0.0 <= self.util_pct <= 100.0:
            force_setattr(self, "util_pct", None)
        if self.mem_used_mb is not None and not 0 <= self.mem_used_mb <= MAX_GPU_MEMORY_MB:
            force_setattr(self, "mem_used_mb", None)
        if self.temp_c is not None and not MIN_GPU_TEMP_C <= self.temp_c <= MAX_GPU_TEMP_C:
            force_setattr(self, "temp_c", None)
        if self.power_w is not None and not 0.0 <= self.power_w <= MAX_GPU_POWER_W:
            force_setattr(self, "power_w", None)
        for name in ("ecc_errors", "xid_errors"):
            count = getattr(self, name)
            if count is not None and not 0 <= count <= MAX_ERROR_COUNT:
                force_setattr(self, name, None if count < 0 else MAX_ERROR_COUNT)


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
        topology: for work that asked to share a network domain, the domain chosen and those
            rejected (:mod:`core.placement.topology`); empty otherwise.
    """

    candidates: int
    filtered: dict[str, int] = {}
    top: list[ScoreCard] = []
    policy: str = "rank-v1"
    topology: str = ""


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
