"""Events of the WORKERS stream (``worker.<worker_id>.<event>``) and the HEARTBEATS stream
(``hb.<worker_id>``)."""

from __future__ import annotations

from schemas._base import Event, Value
from schemas.values import Gpu, GpuTelemetry, Pool


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


WorkerEvent = (
    WorkerRegistered
    | WorkerPolicySet
    | WorkerCordoned
    | WorkerUncordoned
    | WorkerLost
    | WorkerRecovered
    | WorkerDeregistered
)


class Heartbeat(Event, tag="hb.beat", frozen=True, kw_only=True):
    """A worker is alive, with its telemetry.

    Attributes:
        interval_s: the agent's heartbeat interval; a worker silent for 3 intervals is lost.
        gpus: per-GPU readings (empty on a host without NVML).
        cpu_pct / memory_used_mb: host load.
        running: assignment ids the agent is running.
    """

    interval_s: float = 1.0
    gpus: list[GpuTelemetry] = []
    cpu_pct: float = 0.0
    memory_used_mb: int = 0
    running: list[str] = []


HeartbeatEvent = Heartbeat
