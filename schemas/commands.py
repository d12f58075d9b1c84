"""Events of the COMMANDS stream (``cmd.<worker_id>``, a work queue): what the kernel tells an agent.

The command id is the message id, so a command re-sent by a retried decision is stored once, and the
agent executes each command id at most once. Every command carries the assignment epoch: an agent
drops a command whose epoch is older than the newest it has seen for that work.
"""

from __future__ import annotations

from schemas._base import Event, Value
from schemas.values import WorkKind


class WorkSpec(Value, frozen=True, kw_only=True):
    """What to run and with which inputs.

    Attributes:
        runtime: the agent runtime (``process``, ``nvflare-client``, ``torchrun``, ``vllm``, ``cpu-engine``).
        command: argv for the runtime.
        env: extra environment for the workload (never the agent's credentials).
        downloads: presigned GET URLs to fetch before starting, by local file name.
        resume_from: object key of the checkpoint to resume from, if any.
        gpus: GPUs to give the workload.
        vram_mb: free VRAM per GPU the work needs (the agent's VRAM-fraction policy checks it).
        cpus: CPU cores the work uses (CPU work is metered as cores x time).
        pool: the pool the work was placed in (the agent's allowed-pools policy checks it).
        tier: the provider's tier when placed, copied onto usage ticks for payouts.
        shards: how many shards the whole job has.
        options: runtime-specific settings.
    """

    runtime: str
    command: list[str] = []
    env: dict[str, str] = {}
    downloads: dict[str, str] = {}
    resume_from: str | None = None
    gpus: int = 0
    vram_mb: int = 0
    cpus: float = 1.0
    pool: str | None = None
    tier: str = "unverified"
    shards: int = 1
    options: dict[str, str] = {}


class StartWork(Event, tag="cmd.start_work", frozen=True, kw_only=True):
    """Start an assignment on this worker."""

    tenant: str
    work_id: str
    work_kind: WorkKind
    assignment_id: str
    slot: int
    epoch: int
    spec: WorkSpec
    price_micros_per_gpu_hour: int = 0


class StopWork(Event, tag="cmd.stop_work", frozen=True, kw_only=True):
    """Stop an assignment. With ``checkpoint`` the workload checkpoints first (preemption)."""

    work_id: str
    assignment_id: str
    epoch: int
    reason: str
    checkpoint: bool = False


CommandEvent = StartWork | StopWork
