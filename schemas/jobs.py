"""Events of the JOBS stream: ``job.<tenant>.<job_id>.<event>``.

A job's whole history, its placement included, is one subject tree, so that one expected-sequence
check on ``job.<tenant>.<job_id>.>`` orders every decision about it.
"""

from __future__ import annotations

from typing import Literal

from schemas._base import Event, Value
from schemas.values import AssignmentRef, AssignmentRevocation, Placement, Pool, TopologyRequest

JobKind = Literal["federated", "ddp", "process"]
Framework = Literal["numpy", "pytorch"]


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


class FederatedTraining(Value, frozen=True, kw_only=True):
    """The training code of a federated job, in the tenant's workspace: an NVFlare Client API script
    (``script``), around which the kernel generates the FL job, or an NVFlare job folder of the
    tenant's own (``job_folder``). Exactly one of the two is set.

    Attributes:
        script: workspace key of the script every site runs; the other files in its folder (and
            below) ship with it, so that it can import its own modules.
        args: arguments the script is started with.
        framework: how the script exchanges parameters: ``numpy`` (dicts of arrays, the default)
            or ``pytorch`` (state dicts; NVFlare converts them to arrays for the server); for a job
            folder, only whether ``model_out/`` also gets a ``model.pt``.
        initial_model: workspace key of the first global model (``.npz`` of named arrays, or a
            ``.pt`` state dict); without one, round 1 starts from what the persistor loads, else
            from an empty model, and the script starts from its own initial weights (seed them
            identically on every site).
        job_folder: workspace prefix (ending in ``/``) of an NVFlare job folder: ``meta.json`` and
            its apps (``config/config_fed_server.json``, ``config/config_fed_client.json``,
            ``custom/``), mapped onto the job's sites (:mod:`core.flarejob`).
        persistor: ``<workspace key of a .py file>:<class>``, a ``ModelPersistor`` the generated
            job's server uses (its file's folder ships with it); for a script only.
    """

    script: str = ""
    args: list[str] = []
    framework: Framework = "numpy"
    initial_model: str | None = None
    job_folder: str | None = None
    persistor: str | None = None


class JobSubmitted(Event, tag="job.submitted", frozen=True, kw_only=True):
    """A tenant submitted a job. Validated at the edge: every referenced object existed.

    Attributes:
        inputs: workspace object keys the job reads (a key ending in ``/`` names a prefix).
        output_prefix: where the job writes its results in the workspace (empty: the workspace's
            own ``model_out/`` and ``files_out/``).
        federated: the training code of a ``federated`` job.
        image: the container image each shard runs in (``None``: the worker's own environment);
            only workers that run images take such a job.
        strategy: how a ``ddp`` job's script shards the model (``ddp``, ``fsdp``, ``deepspeed``;
            ``None``: ``ddp``),
            given to it as ``$RESONTECH_STRATEGY``.
        topology: the network domain the shards must (or should) share (``None``: any workers).
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
    federated: FederatedTraining | None = None
    image: str | None = None
    strategy: str | None = None
    topology: TopologyRequest | None = None


class JobQueued(Event, tag="job.queued", frozen=True, kw_only=True):
    """The job waits for capacity; ``reason`` says what it waits for."""

    reason: str


class JobPlaced(Event, Placement, tag="job.placed", frozen=True, kw_only=True):
    """A gang placement: every listed shard was assigned at once (all N or none)."""


class JobAssignmentRevoked(
    Event, AssignmentRevocation, tag="job.assignment_revoked", frozen=True, kw_only=True
):
    """A shard's assignment was taken back (worker lost, preempted, rejected, failed)."""


class JobRejected(Event, tag="job.rejected", frozen=True, kw_only=True):
    """An agent refused an assignment; the reason comes from its provider policy."""

    assignment_id: str
    worker_id: str
    epoch: int
    reason: str


class JobStarted(Event, AssignmentRef, tag="job.started", frozen=True, kw_only=True):
    """An agent started a shard's workload."""


class JobProgress(Event, tag="job.progress", frozen=True, kw_only=True):
    """Training progress of one shard (or of the whole job when ``slot`` is ``None``).

    Attributes:
        assignment_id: the assignment that reports it (a shard's agent); empty for the kernel's own
            job-wide progress (a federated round's).
    """

    epoch: int
    slot: int | None = None
    assignment_id: str = ""
    round: int | None = None
    train_epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    metrics: dict[str, float] = {}
    gpu_util_pct: float | None = None


class JobCheckpointed(Event, tag="job.checkpointed", frozen=True, kw_only=True):
    """A checkpoint was written to the tenant's workspace; recovery resumes from the latest one.

    Attributes:
        object_key: where; an agent's checkpoint lies under the job's own checkpoint prefix
            (``jobs/<name>/checkpoints/<job_id>/``): the kernel refuses any other key. For a
            sharded checkpoint, the folder its parts lie in.
        parts: a sharded checkpoint's complete set, one part per node in node order (each a
            ``job.checkpoint_part_stored``); only the kernel names a set, once every node's part of
            one step is stored. Empty for a checkpoint of one file.
        assignment_id: the assignment that reports it; empty for the kernel's own.
    """

    epoch: int
    object_key: str
    round: int | None = None
    slot: int | None = None
    step: int | None = None
    assignment_id: str = ""
    parts: list[str] = []


class JobCheckpointPartStored(Event, tag="job.checkpoint_part_stored", frozen=True, kw_only=True):
    """One node's part of a sharded checkpoint is stored: its agent uploaded the files its ranks
    wrote for ``step`` (``torch.distributed.checkpoint``), as one archive, to ``object_key``. The
    checkpoint counts once every node's part of the step is stored (the kernel's
    ``job.checkpointed`` naming the set)."""

    epoch: int
    slot: int
    step: int
    object_key: str
    assignment_id: str


class JobRoundCompleted(Event, tag="job.round_completed", frozen=True, kw_only=True):
    """A federated round finished (aggregation done)."""

    round: int
    metrics: dict[str, float] = {}


class JobShardCompleted(Event, AssignmentRef, tag="job.shard_completed", frozen=True, kw_only=True):
    """One shard's workload exited successfully; the job completes when every shard has."""


class JobCompleted(Event, tag="job.completed", frozen=True, kw_only=True):
    """The job finished; ``outputs`` are the object keys it produced (``model_out/``, ``files_out/``)."""

    outputs: list[str] = []


class JobFailed(Event, tag="job.failed", frozen=True, kw_only=True):
    """A shard or the whole job failed. ``log_tail`` is the end of the workload's log.

    Attributes:
        assignment_id: the assignment whose shard failed (its agent's report); empty for the
            kernel's job-wide failure.
    """

    reason: str
    epoch: int | None = None
    slot: int | None = None
    log_tail: str = ""
    retryable: bool = False
    assignment_id: str = ""


class JobFederationReady(Event, tag="job.federation_ready", frozen=True, kw_only=True):
    """The kernel provisioned the job's own federation and started its FL server: the coordinator
    may now start the job's clients (a federated shard's ``start_work`` waits for this event).

    Attributes:
        server: ``host:port`` the clients connect to.
        sites: the NVFlare client name of each slot (slot ``i`` runs ``sites[i]``, whichever worker
            it lands on: a replacement gets the same identity).
        kit_bucket: the kernel bucket that holds the startup kits (never a tenant's).
        kits: object key of each slot's startup kit ZIP (its certificate and key) in ``kit_bucket``.
        shards: workspace key of each slot's shard ZIP; empty when the job has no shards (its
            sites get no data).
    """

    server: str
    sites: list[str]
    kit_bucket: str
    kits: list[str]
    shards: list[str]


class JobFederationRun(Event, tag="job.federation_run", frozen=True, kw_only=True):
    """The kernel submitted an FL run to the job's federation: the first one, or a restart from the
    last global model after a client or the FL server was lost (the round in flight is redone).

    Attributes:
        run_id: NVFlare's job id of the run.
        first_round: the round it starts with (1-based).
        rounds: how many rounds it runs.
        reason: why it was submitted (``start``, or what it replaces).
        resume_from: workspace key of the global model it starts from, if any.
    """

    run_id: str
    first_round: int
    rounds: int
    reason: str = "start"
    resume_from: str | None = None


class JobFederationStopped(Event, tag="job.federation_stopped", frozen=True, kw_only=True):
    """The job's FL server stopped, or is about to be restarted: the coordinator starts no client
    until the next ``job.federation_ready`` (clients already running stay and reconnect).

    Attributes:
        reason: why (the job waits for workers, the server died, the federation service restarted).
    """

    reason: str


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
    | JobCheckpointPartStored
    | JobRoundCompleted
    | JobShardCompleted
    | JobCompleted
    | JobFailed
    | JobCancelled
    | JobFederationReady
    | JobFederationRun
    | JobFederationStopped
)
