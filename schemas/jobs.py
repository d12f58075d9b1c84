"""Events of the JOBS stream: ``job.<tenant>.<job_id>.<event>``.

A job's whole history, its placement included, is one subject tree, so that one expected-sequence
check on ``job.<tenant>.<job_id>.>`` orders every decision about it.
"""

from __future__ import annotations

from typing import Literal

from schemas._base import Event, Value
from schemas.values import Assignment, Pool, Provenance

JobKind = Literal["federated", "ddp", "process"]


class JobResources(Value, frozen=True, kw_only=True):
    """What each shard of a job needs from a worker.

    Attributes:
        gpus: GPUs per shard (0 for CPU work).
        vram_mb: free VRAM per GPU the shard needs (the "VRAM hint").
        gpu_type: a GPU model family (``A100``), or ``None`` for any.
        cpus: CPU cores per shard.
        memory_mb: host memory per shard.
    """

    gpus: int = 0
    vram_mb: int = 0
    gpu_type: str | None = None
    cpus: float = 1.0
    memory_mb: int = 1024


class JobSubmitted(Event, tag="job.submitted", frozen=True, kw_only=True):
    """A tenant submitted a job. Validated at the edge: every referenced object existed.

    Attributes:
        inputs: workspace object keys the job reads (a key ending in ``/`` names a prefix).
        output_prefix: where the job writes its results in the workspace (empty: the workspace's
            own ``model_out/`` and ``files_out/``).
    """

    name: str
    kind: JobKind
    shards: int
    resources: JobResources = JobResources()
    pool: Pool = "shared"
    priority: int = 0
    region: str | None = None
    rounds: int | None = None
    local_epochs: int | None = None
    command: list[str] = []
    env: dict[str, str] = {}
    inputs: list[str] = []
    max_price_micros_per_gpu_hour: int | None = None
    submitted_by: str = ""
    output_prefix: str = ""


class JobQueued(Event, tag="job.queued", frozen=True, kw_only=True):
    """The job waits for capacity; ``reason`` says what it waits for."""

    reason: str


class JobPlaced(Event, tag="job.placed", frozen=True, kw_only=True):
    """A gang placement: every listed shard was assigned at once (all N or none)."""

    assignments: list[Assignment]
    provenance: Provenance


class JobAssignmentRevoked(Event, tag="job.assignment_revoked", frozen=True, kw_only=True):
    """A shard's assignment was taken back (worker lost, preempted, rejected, failed)."""

    assignment_id: str
    worker_id: str
    slot: int
    epoch: int
    reason: str


class JobRejected(Event, tag="job.rejected", frozen=True, kw_only=True):
    """An agent refused an assignment; the reason comes from its provider policy."""

    assignment_id: str
    worker_id: str
    epoch: int
    reason: str


class JobStarted(Event, tag="job.started", frozen=True, kw_only=True):
    """An agent started a shard's workload."""

    assignment_id: str
    worker_id: str
    slot: int
    epoch: int


class JobProgress(Event, tag="job.progress", frozen=True, kw_only=True):
    """Training progress of one shard (or of the whole job when ``slot`` is ``None``)."""

    epoch: int
    slot: int | None = None
    round: int | None = None
    train_epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    metrics: dict[str, float] = {}
    gpu_util_pct: float | None = None


class JobCheckpointed(Event, tag="job.checkpointed", frozen=True, kw_only=True):
    """A checkpoint was written to the tenant's workspace; recovery resumes from the latest one."""

    epoch: int
    object_key: str
    round: int | None = None
    slot: int | None = None
    step: int | None = None


class JobRoundCompleted(Event, tag="job.round_completed", frozen=True, kw_only=True):
    """A federated round finished (aggregation done)."""

    round: int
    metrics: dict[str, float] = {}


class JobShardCompleted(Event, tag="job.shard_completed", frozen=True, kw_only=True):
    """One shard's workload exited successfully; the job completes when every shard has."""

    assignment_id: str
    worker_id: str
    slot: int
    epoch: int


class JobCompleted(Event, tag="job.completed", frozen=True, kw_only=True):
    """The job finished; ``outputs`` are the object keys it produced (``model_out/``, ``files_out/``)."""

    outputs: list[str] = []


class JobFailed(Event, tag="job.failed", frozen=True, kw_only=True):
    """A shard or the whole job failed. ``log_tail`` is the end of the workload's log."""

    reason: str
    epoch: int | None = None
    slot: int | None = None
    log_tail: str = ""
    retryable: bool = False


class JobCancelled(Event, tag="job.cancelled", frozen=True, kw_only=True):
    """The tenant (or an operator) cancelled the job."""

    by: str
    reason: str = ""


JobEvent = (
    JobSubmitted
    | JobQueued
    | JobPlaced
    | JobAssignmentRevoked
    | JobRejected
    | JobStarted
    | JobProgress
    | JobCheckpointed
    | JobRoundCompleted
    | JobShardCompleted
    | JobCompleted
    | JobFailed
    | JobCancelled
)
