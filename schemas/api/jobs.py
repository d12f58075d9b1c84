"""Bodies of the jobs routes: the job spec a tenant submits, the job as the API shows it, its events.

The spec has room for every job kind: ``process``, ``ddp`` (torchrun) and ``federated`` (NVFlare:
``rounds``, ``local_epochs`` and the ``federated`` training code) all run today.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas.api.common import Page, PageQuery, Request
from schemas.jobs import JobSubmitted
from schemas.values import IMAGE_PATTERN, MAX_IMAGE_LENGTH, TopologyRequest

Token = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
"""Letters, digits, ``-`` and ``_``, 1-64 characters (safe as a subject token)."""
JobName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
"""Letters, digits, ``.``, ``-`` and ``_``, 1-64 characters: the ``{name}`` of ``jobs/{name}/``."""
ObjectKey = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
Image = Annotated[str, msgspec.Meta(max_length=MAX_IMAGE_LENGTH, pattern=IMAGE_PATTERN)]
"""A plain container image reference (``registry/name:tag``, optionally ``@sha256:<digest>``)."""
Kind = Literal["process", "federated", "ddp"]
Pool = Literal["shared", "managed", "private"]
JobStateName = Literal["queued", "placed", "running", "completed", "failed", "cancelled"]
MAX_SHARDS = 1024
MAX_INPUTS = 1000
HIDDEN = "(hidden)"
"""What the API shows for the value of a job's environment variable."""


class Resources(Request, frozen=True, kw_only=True):
    """What each shard needs from a worker.

    Attributes:
        gpus: GPUs per shard (0: CPU work, the default).
        vram_mb: free VRAM per GPU, MiB (0: any).
        gpu_type: a GPU family (``A100``, ``H100``, ``RTX4090``), ``null`` for any.
        cpus: CPU cores per shard (default 1).
        memory_mb: host memory per shard, MiB (default 1024).
    """

    gpus: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0
    vram_mb: Annotated[int, msgspec.Meta(ge=0, le=4_194_304)] = 0
    gpu_type: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    cpus: Annotated[float, msgspec.Meta(gt=0, le=4096)] = 1.0
    memory_mb: Annotated[int, msgspec.Meta(ge=1, le=67_108_864)] = 1024


class FederatedSpec(Request, frozen=True, kw_only=True):
    """The training code of a ``federated`` job, in the workspace: an NVFlare Client API script
    (``script``; the kernel generates the FL job around it) or an NVFlare job folder (``job_folder``).
    Give exactly one of the two.

    Attributes:
        script: workspace key of the script each site runs (e.g. ``jobs/{name}/scripts/train.py``);
            the files beside and below it ship with it. It reads its shard from the directory in
            ``RESONTECH_DATA_ROOT`` (empty when the job has no shards) and sends each round's model
            with ``NUM_STEPS_CURRENT_ROUND`` set to its sample count (FedAvg weighs by it).
        job_folder: workspace prefix (ending in ``/``) of an NVFlare job folder: ``meta.json`` with its
            ``deploy_map``, and apps with ``config/config_fed_server.json``,
            ``config/config_fed_client.json`` and ``custom/``. Its client names become the job's
            ``site-1`` .. ``site-N``; the kernel sets its training workflow's ``num_rounds`` (from
            ``rounds``), ``start_round`` and ``persistor_id`` (see docs/federated.md).
        args: the script's arguments (no whitespace inside one: NVFlare splits them on whitespace).
        framework: ``numpy`` (default) or ``pytorch``: what ``flare.receive()`` gives the script; for
            a job folder, ``pytorch`` only adds ``model_out/model.pt``.
        initial_model: workspace key of the first global model (``.npz`` of named arrays, or a
            PyTorch ``.pt`` state dict); default none: round 1 starts from what the persistor loads,
            else from an empty model (the script starts from its own weights).
        persistor: ``<workspace key of a .py file>:<class>``: a NVFlare ``ModelPersistor`` the server
            loads round 1's model with (unless ``initial_model`` is given) and hands every round's
            global model to; its file's folder ships with it. It runs on the kernel's FL server, in
            the job's own directory, with a clean environment. For a ``script`` only.
    """

    script: ObjectKey | None = None
    job_folder: ObjectKey | None = None
    args: Annotated[list[Annotated[str, msgspec.Meta(max_length=1024)]], msgspec.Meta(max_length=64)] = []
    framework: Literal["numpy", "pytorch"] = "numpy"
    initial_model: ObjectKey | None = None
    persistor: Annotated[str, msgspec.Meta(min_length=1, max_length=1100)] | None = None


class SubmitJob(Request, frozen=True, kw_only=True):
    """A job spec.

    Attributes:
        name: the job's name; its workspace folder is ``jobs/{name}/``. Names may repeat.
        kind: ``process`` (a command on each shard's worker); ``ddp`` (one torchrun node per
            shard; ``command`` starts with the training script, a key among ``inputs``);
            ``federated`` (NVFlare: one client per shard, FedAvg on the kernel; shard ``i`` is the
            ``i``-th ZIP, by name, under ``jobs/{name}/shards/``; with no ZIP there, each site
            starts with an empty data folder, and some but fewer than ``shards`` is a 422).
        job_id: the job's id (default: generated; derived from the ``Idempotency-Key`` header
            when one is sent). A duplicate id is a 409.
        shards: how many workers run it at once (gang-placed: all or none).
        rounds / local_epochs: federated only (``local_epochs`` reaches the script as
            ``RESONTECH_LOCAL_EPOCHS``).
        federated: the training code of a federated job (required for one, refused for others).
        resources: per shard.
        pool: ``shared`` (default), ``managed`` or ``private``.
        priority: -100..100, higher first within the tenant's queue (default 0).
        region: preferred region (geo affinity).
        command: argv run on each worker (required for ``process`` and ``ddp``).
        env: extra environment variables for the workload (names ``[A-Z_][A-Z0-9_]*``, not
            ``RESONTECH_*``).
        inputs: workspace object keys the job reads; each must exist (a key ending in ``/`` must
            have at least one object under it), else 422 ``missing_objects``.
        output_prefix: workspace prefix the job writes to, ending in ``/`` (default: the
            workspace's ``model_out/`` and ``files_out/``).
        max_price_micros_per_gpu_hour: the most the tenant pays per GPU-hour (default: list price).
        strategy: how a ``ddp`` job's script spreads the model over its ranks, passed to it as
            ``$RESONTECH_STRATEGY``: ``ddp`` (the default: every rank holds the whole model) or
            ``fsdp`` (FSDP2: parameters, gradients and optimizer state sharded over every rank);
            ``deepspeed`` (DeepSpeed ZeRO; the script picks the stage). ``ddp`` jobs only.
        image: the container image each shard runs in (``registry/name:tag``, a ``@sha256:``
            digest to pin it). Only workers that run images take such a job: today the nodes of the
            kernel's own Kubernetes clusters. Default: the worker's own environment.
        topology: ``{"level": "rack", "mode": "required"}``: every shard inside one network
            domain of that level (``clique``, ``switch``, ``rack``, ``block``, ``zone``), or wait;
            ``"mode": "preferred"`` climbs to the next wider level when none has room, and places
            across domains last. Default: any workers.
    """

    name: JobName
    kind: Kind
    job_id: Token | None = None
    shards: Annotated[int, msgspec.Meta(ge=1, le=MAX_SHARDS)] = 1
    rounds: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None = None
    local_epochs: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None = None
    resources: Resources = Resources()
    pool: Pool = "shared"
    priority: Annotated[int, msgspec.Meta(ge=-100, le=100)] = 0
    region: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")] | None = None
    command: Annotated[list[Annotated[str, msgspec.Meta(max_length=8192)]], msgspec.Meta(max_length=256)] = []
    env: Annotated[
        dict[str, Annotated[str, msgspec.Meta(max_length=8192)]], msgspec.Meta(max_length=100)
    ] = {}
    inputs: Annotated[list[ObjectKey], msgspec.Meta(max_length=MAX_INPUTS)] = []
    output_prefix: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    max_price_micros_per_gpu_hour: Annotated[int, msgspec.Meta(ge=0)] | None = None
    federated: FederatedSpec | None = None
    image: Image | None = None
    strategy: Literal["ddp", "fsdp", "deepspeed"] | None = None
    topology: TopologyRequest | None = None


class TenantQuery(Request, frozen=True, kw_only=True):
    """The tenant acted on: a tenant key's own (naming another is a 404); the operator must name one."""

    tenant: str | None = None


class JobListQuery(PageQuery, frozen=True, kw_only=True):
    """Filters of ``GET /v1/jobs``, newest first.

    Attributes:
        state / kind: only jobs in this state / of this kind.
        name_prefix: only jobs whose name starts with this.
        limit: page size, 1-200 (default 50). ``after``: the ``next`` cursor of the previous page.
    """

    limit: Annotated[int, msgspec.Meta(ge=1, le=200)] = 50
    tenant: str | None = None
    state: JobStateName | None = None
    kind: Kind | None = None
    name_prefix: Annotated[str, msgspec.Meta(max_length=64)] | None = None


class EventsQuery(PageQuery, frozen=True, kw_only=True):
    """A page of a job's events in log order: at most ``limit`` (1-500, default 100) after ``after``."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100
    tenant: str | None = None


class JobAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """One shard's current placement."""

    slot: int
    worker_id: str
    assignment_id: str
    epoch: int
    gpus: int
    started: bool
    done: bool


class JobProgressView(msgspec.Struct, frozen=True, kw_only=True):
    """The latest training progress (values an event left out keep their previous value)."""

    round: int | None = None
    epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    gpu_util_pct: float | None = None
    metrics: dict[str, float] = {}


class CheckpointView(msgspec.Struct, frozen=True, kw_only=True):
    """The latest checkpoint: the workspace key recovery resumes from; for a sharded checkpoint, the
    folder of its ``parts`` (one archive per node, in node order)."""

    object_key: str
    round: int | None = None
    step: int | None = None
    parts: list[str] = []


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """A job as the API shows it: its submission whole (``spec``) and what has happened since.

    Attributes:
        spec: the ``job.submitted`` event as stored (the spec as validated, with ``submitted_by``);
            environment values are never shown: each reads :data:`HIDDEN`.
        state: ``queued``, ``placed``, ``running``, ``completed``, ``failed`` or ``cancelled``.
        pending_reason: why a queued job waits.
        why: on ``GET /v1/jobs/{job_id}`` only: the same lines as ``resontech why``.
        rounds_completed: federated rounds aggregated so far.
        submitted_at / ended_at: ISO 8601 UTC.
    """

    job_id: str
    tenant: str
    spec: JobSubmitted
    state: str
    submitted_at: str
    ended_at: str | None
    pending_reason: str | None
    assignments: list[JobAssignment]
    progress: JobProgressView | None
    last_checkpoint: CheckpointView | None
    rounds_completed: int
    failures: int
    failure_reason: str
    log_tail: str
    rejected_by: dict[str, str]
    outputs: list[str]
    cancelled_by: str
    why: list[str] | None = None


class JobEventItem(msgspec.Struct, frozen=True, kw_only=True):
    """One stored event of a job: its JOBS sequence, store time, type and body as stored."""

    seq: int
    time: str
    type: str
    event: dict[str, Any]


class TelemetryQuery(Request, frozen=True, kw_only=True):
    """``GET /v1/jobs/{job_id}/telemetry``: at most ``points`` samples per worker (1-2000, default 300)."""

    points: Annotated[int, msgspec.Meta(ge=1, le=2000)] = 300
    tenant: str | None = None


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's GPUs over one stretch of time: the mean of the heartbeats that fell in it.

    Attributes:
        time_s: the mean time of those heartbeats, Unix seconds.
        util_pct: mean GPU utilisation over the worker's GPUs, percent (``null``: NVML reported none).
        mem_used_mb: GPU memory used on all the worker's GPUs together, MiB (``null``: none reported).
        beats: how many heartbeats it averages.
    """

    time_s: float
    util_pct: float | None = None
    mem_used_mb: float | None = None
    beats: int = 1


class TelemetrySpan(msgspec.Struct, frozen=True, kw_only=True):
    """One assignment of the job on the worker, as the schedule held it: from its placement to its
    revocation, its replacement or the job's end (``ended_at`` ``null``: it still holds it)."""

    assignment_id: str
    slot: int
    epoch: int
    placed_at: str
    ended_at: str | None = None


class WorkerTelemetry(msgspec.Struct, frozen=True, kw_only=True):
    """One worker that held an assignment of the job, and its GPU readings while it did.

    Attributes:
        spans: the job's assignments it held, oldest first.
        beats: its heartbeats within those spans.
        withheld: of those, how many were left out: the worker also ran work other than this job's
            then, and a heartbeat's readings are the whole host's.
        samples: the readings downsampled to at most the query's ``points``, oldest first (only
            from heartbeats that carried GPU readings).
    """

    worker_id: str
    spans: list[TelemetrySpan]
    beats: int
    withheld: int
    samples: list[GpuSample]


class JobTelemetry(msgspec.Struct, frozen=True, kw_only=True):
    """GPU utilisation and memory of the job's workers over time (``points``: the bound per worker)."""

    job_id: str
    points: int
    workers: list[WorkerTelemetry]


JobPage = Page[Job]
JobEventPage = Page[JobEventItem]
