"""Events of the WORKERS stream (``worker.<worker_id>.<event>``) and the HEARTBEATS stream
(``hb.<worker_id>``)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta
from msgspec.structs import force_setattr

from schemas._base import Event, Value
from schemas.values import Gpu, GpuTelemetry, Pool, Sandboxing


class MaintenanceWindow(Value, frozen=True, kw_only=True):
    """A weekly window in which the worker takes no new work (UTC).

    Attributes:
        weekday: 0 = Monday ... 6 = Sunday.
        start_minute / end_minute: minutes after midnight, ``start < end``.
    """

    weekday: int
    start_minute: int
    end_minute: int


class WorkerPolicy(Value, frozen=True, kw_only=True):
    """A provider's accept/reject policy for one worker. ``None`` / empty means no restriction."""

    allowed_tenants: list[str] = []
    allowed_pools: list[Pool] = []
    min_price_micros_per_gpu_hour: int | None = None
    max_concurrent: int | None = None
    max_vram_fraction: float = 1.0
    maintenance: list[MaintenanceWindow] = []


class WorkerRegistered(Event, tag="worker.registered", frozen=True, kw_only=True):
    """An agent registered (or re-registered after a restart with the same worker id).

    Attributes:
        address: the host address other workers reach this one at (the rendezvous of a distributed
            job whose shard 0 it holds); empty when the agent did not say.
        sandbox: how the host isolates workloads (:mod:`core.sandbox`): ``bubblewrap``;
            ``kubernetes`` (a node of the kernel's own cluster, :mod:`ops.dispatcher`: every workload
            is a container, so it alone runs work that names an ``image``; the intake accepts it
            only from the kernel's node-workers); ``off``
            (started ``--unsandboxed`` for local development: it takes only its owner's work);
            ``unavailable`` (the sandbox cannot start here: it takes no work, ``sandbox_problem``
            says why); empty from agents older than the sandbox and from simulated ones.
        sandbox_problem: why the sandbox cannot start on this host.
        topology: the host's network domains, level -> name (:data:`schemas.values.TOPOLOGY_LEVELS`):
            its NVLink clique from NVML, the provider's labels, a node's Kubernetes labels. A claim:
            placement reads each name within its provider only, so no worker joins another
            provider's domain.
    """

    provider: str
    hostname: str
    region: str = ""
    pool: Pool = "shared"
    owner_tenant: str | None = None
    gpus: list[Gpu] = []
    cpus: int = 0
    memory_mb: int = 0
    driver: str = ""
    agent_version: str = ""
    labels: dict[str, str] = {}
    address: str = ""
    sandbox: Sandboxing = ""
    sandbox_problem: str = ""
    topology: dict[str, str] = {}


class WorkerPolicySet(Event, tag="worker.policy_set", frozen=True, kw_only=True):
    """The provider's policy for this worker changed."""

    policy: WorkerPolicy


class WorkerCordoned(Event, tag="worker.cordoned", frozen=True, kw_only=True):
    """The worker takes no new work (health controller or an operator)."""

    reason: str
    by: str


class WorkerUncordoned(Event, tag="worker.uncordoned", frozen=True, kw_only=True):
    """The worker takes work again."""

    by: str


class WorkerLost(Event, tag="worker.lost", frozen=True, kw_only=True):
    """No heartbeat for ``silent_s`` seconds; its assignments are revoked and re-placed."""

    silent_s: float
    last_heartbeat_seq: int = 0


class WorkerRecovered(Event, tag="worker.recovered", frozen=True, kw_only=True):
    """A lost worker heartbeats again; its old assignments stay fenced."""

    down_s: float = 0.0


class WorkerDeregistered(Event, tag="worker.deregistered", frozen=True, kw_only=True):
    """The provider removed the worker."""

    reason: str = ""


class WorkerVerificationRequested(Event, tag="worker.verification_requested", frozen=True, kw_only=True):
    """The kernel gave a new (or changed) worker its verification job: a short compute benchmark
    seeded with ``seed``, and on GPU hosts an NVML cross-check of the GPUs it registered. Until it
    passes, the worker takes no tenant work (:mod:`core.verification`).

    Attributes:
        challenge_id: names the challenge; the report must name it.
        seed: hex; the benchmark's input is derived from it, so that no answer can be prepared.
        size / rounds: the benchmark's matrix size and how many products it chains.
        deadline_s: seconds the worker has to report; after them the challenge failed.
        requested_by: the kernel instance that asked.
    """

    challenge_id: str
    seed: str
    size: int
    rounds: int
    deadline_s: float
    requested_by: str = ""


class WorkerVerificationReported(Event, tag="worker.verification_reported", frozen=True, kw_only=True):
    """An agent's answer to its verification job. A claim, never stored on WORKERS: the intake
    checks it against the challenge and the registration and appends ``verified`` or
    ``verification_failed``.

    Attributes:
        checksum: the benchmark's result (hex).
        elapsed_ms: how long the benchmark took on the worker.
        gpus: the GPUs NVML showed the verification workload.
        gpu_tflops: the measured matrix-multiply throughput of GPU 0, on GPU hosts.
        error: why the workload could not answer, if it could not.
    """

    challenge_id: str
    checksum: str = ""
    elapsed_ms: int = 0
    gpus: list[Gpu] = []
    gpu_tflops: float | None = None
    error: str = ""


class WorkerVerified(Event, tag="worker.verified", frozen=True, kw_only=True):
    """The worker passed its verification job (or an operator vouched for it: ``by``); it takes
    tenant work from now on.

    Attributes:
        elapsed_ms / gpu_tflops: what the benchmark measured.
    """

    challenge_id: str = ""
    elapsed_ms: int = 0
    gpu_tflops: float | None = None
    by: str = ""


class WorkerVerificationFailed(Event, tag="worker.verification_failed", frozen=True, kw_only=True):
    """The worker's verification job failed: its answer was wrong, its GPUs are not the ones it
    registered, or it did not answer in time. It stays unverified (no tenant work) with ``reason``;
    the kernel tries again later."""

    reason: str
    challenge_id: str = ""
    by: str = ""


WorkerEvent = (
    WorkerRegistered
    | WorkerPolicySet
    | WorkerCordoned
    | WorkerUncordoned
    | WorkerLost
    | WorkerRecovered
    | WorkerDeregistered
    | WorkerVerificationRequested
    | WorkerVerificationReported
    | WorkerVerified
    | WorkerVerificationFailed
)


MAX_BEAT_INTERVAL_S = 3600.0
"""The longest heartbeat interval a beat may state, seconds (the bound of the agent's own setting,
``RESONTECH_AGENT_HEARTBEAT_INTERVAL_S``); :data:`core.clock.MAX_BEAT_INTERVAL_S` is this."""
MIN_BEAT_INTERVAL_S = 0.2
"""The shortest heartbeat interval the kernel believes, seconds: a beat stating less (but more than
zero) is read as stating this. An agent's interval is no budget: the kernel folds at most one beat
of a worker per :data:`projections.liveness.MIN_BEAT_GAP_NS` (half of this), so a worker beating
faster than this would otherwise be declared silent between the beats the kernel folds."""
MAX_BEAT_GPUS = 64
"""GPU readings one beat may carry: more GPUs than any host has."""
MAX_BEAT_RUNNING = 1024
"""Assignment ids one beat may name as running."""
MAX_RUNNING_ID_CHARS = 512
MAX_HOST_MEMORY_MB = 1 << 32
"""4 PiB: more memory than any host has; a reading above it is no reading."""

BeatInterval = Annotated[float, Meta(gt=0.0, le=MAX_BEAT_INTERVAL_S)]
BeatGpus = Annotated[list[GpuTelemetry], Meta(max_length=MAX_BEAT_GPUS)]
BeatRunning = Annotated[
    list[Annotated[str, Meta(max_length=MAX_RUNNING_ID_CHARS)]], Meta(max_length=MAX_BEAT_RUNNING)
]


class Heartbeat(Event, tag="hb.beat", frozen=True, kw_only=True):
    """A worker is alive, with its telemetry.

    Agents publish their beats on ``hb.<own id>`` directly (no intake: a beat is too frequent to
    judge), so a beat is its agent's word and is bounded where it is decoded:

    * its shape: an ``interval_s`` that is not a number in ``(0, MAX_BEAT_INTERVAL_S]``, more than
      :data:`MAX_BEAT_GPUS` readings or :data:`MAX_BEAT_RUNNING` ids (or an id over
      :data:`MAX_RUNNING_ID_CHARS`) fail to decode: the whole beat is quarantined and every reader
      skips it (:mod:`core.log.decoding`), so the worker's previous beat stays its latest and the
      kernel's own clock declares it lost (:mod:`core.clock`). No agent of ours sends such a beat.
    * its interval: one below :data:`MIN_BEAT_INTERVAL_S` reads as that minimum (a worker cannot
      pick a tiny interval to be folded more often: see :mod:`projections.liveness`).
    * its readings: a host reading out of range (``cpu_pct`` outside 0 to 100, ``memory_used_mb``
      negative or above :data:`MAX_HOST_MEMORY_MB`, NaN) reads 0, and each GPU reading is bounded by
      :class:`~schemas.values.GpuTelemetry`: the beat is still a sign of life.

    What a beat says about work (``running``) and GPUs is believed about nothing else: readers show
    a beat's telemetry for the assignments the schedule says its worker holds, and GPU readings only
    for GPUs the worker registered (:func:`projections.liveness.registered_readings`).

    Attributes:
        interval_s: the agent's heartbeat interval, seconds; a worker silent for 3 intervals is lost.
        gpus: per-GPU readings (empty on a host without NVML).
        cpu_pct / memory_used_mb: host load: percent of the host's CPU time, MiB in use.
        running: assignment ids the agent is running.
    """

    interval_s: BeatInterval = 1.0
    gpus: BeatGpus = []
    cpu_pct: float = 0.0
    memory_used_mb: int = 0
    running: BeatRunning = []

    def __post_init__(self) -> None:
        if 0.0 < self.interval_s < MIN_BEAT_INTERVAL_S:  # the kernel folds no more than it believes
            force_setattr(self, "interval_s", MIN_BEAT_INTERVAL_S)
        if not 0.0 <= self.cpu_pct <= 100.0:  # False for NaN too
            force_setattr(self, "cpu_pct", 0.0)
        if not 0 <= self.memory_used_mb <= MAX_HOST_MEMORY_MB:
            force_setattr(self, "memory_used_mb", 0)


HeartbeatEvent = Heartbeat
