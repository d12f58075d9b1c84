"""Events of the COMMANDS stream (``cmd.<worker_id>``, a work queue): what the kernel tells an agent.

The command id is the message id, so a command re-sent by a retried decision is stored once, and the
agent executes each command id at most once. Every command carries the assignment epoch: an agent
drops a command whose epoch is older than the newest it has seen for that work.
"""

from __future__ import annotations

from typing import Literal

from schemas._base import Event, Value
from schemas.values import WorkKind


class Rendezvous(Value, frozen=True, kw_only=True):
    """Where the nodes of a distributed (torchrun) job meet: one node per shard, static rendezvous.

    Attributes:
        master_addr / master_port: the TCP store of node 0, on the host of the worker holding shard 0.
        nnodes: how many nodes (shards) meet; torchrun's ``WORLD_SIZE`` is ``nnodes x nproc_per_node``.
        node_rank: this node's rank (its shard's slot).
        nproc_per_node: processes (ranks) per node: the shard's GPUs, or 1 on CPU.
        backend: the collective backend the ranks should use: ``nccl`` on GPUs, ``gloo`` on CPU.
        timeout_s: how long a node waits for the others at the rendezvous before it fails.
    """

    master_addr: str
    master_port: int
    nnodes: int
    node_rank: int
    nproc_per_node: int = 1
    backend: str = "gloo"
    timeout_s: int = 300


class WorkSpec(Value, frozen=True, kw_only=True):
    """What to run and with which inputs.

    Attributes:
        runtime: the agent runtime (``process``, ``nvflare-client``, ``torchrun``, ``vllm``, ``cpu-engine``).
        command: argv for the runtime.
        env: extra environment for the workload (never the agent's credentials).
        downloads: presigned GET URLs to fetch before starting, by local file name.
        resume_from: object key of the checkpoint to resume from, if any.
        resume_url: a presigned GET of ``resume_from``, fetched before starting.
        checkpoint_urls: object key -> presigned PUT URL: the agent uploads the checkpoint files the
            workload reports (``RESONTECH_CHECKPOINT {"path": ...}``) to them in turn, so that the
            workload never holds object-store credentials.
        part_urls: object key -> presigned PUT URL, for this node's parts of sharded checkpoints
            (``RESONTECH_CHECKPOINT {"dir": ...}``), used in turn like ``checkpoint_urls``.
        resume_parts: object key -> presigned GET URL of every part of the sharded checkpoint to
            resume from (``resume_from`` is its folder), in node order; ``resume_step`` its step.
        rendezvous: where the nodes of a distributed job meet (``torchrun``).
        gpus: GPUs to give the workload.
        vram_mb: free VRAM per GPU the work needs (the agent's VRAM-fraction policy checks it).
        cpus: CPU cores the work uses (CPU work is metered as cores x time).
        memory_mb: host memory the workload may use, MiB (0: no limit of its own); the agent's
            sandbox enforces it (:mod:`core.cgroups`).
        pool: the pool the work was placed in (the agent's allowed-pools policy checks it).
        tier: the provider's tier when placed, copied onto usage ticks for payouts.
        shards: how many shards the whole job has.
        options: runtime-specific settings.
        image: the container image the work names (``None``: the worker's own environment). Only a
            worker that runs images (``sandbox`` ``kubernetes``) is given such work; any other
            refuses it.
    """

    runtime: str
    command: list[str] = []
    env: dict[str, str] = {}
    downloads: dict[str, str] = {}
    resume_from: str | None = None
    resume_url: str | None = None
    checkpoint_urls: dict[str, str] = {}
    part_urls: dict[str, str] = {}
    resume_parts: dict[str, str] = {}
    resume_step: int | None = None
    rendezvous: Rendezvous | None = None
    gpus: int = 0
    vram_mb: int = 0
    cpus: float = 1.0
    memory_mb: int = 0
    pool: str | None = None
    tier: str = "unverified"
    shards: int = 1
    options: dict[str, str] = {}
    image: str | None = None


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
    """Stop an assignment. With ``checkpoint`` the workload checkpoints first (preemption).

    Attributes:
        tenant / work_kind: whose work it stops: the agent stops the assignment only when they are
            those of the ``start_work`` it runs (a tenant may choose another tenant's job id, and a
            job and an endpoint may share one). Empty in stops sent before stops named them: the
            agent then takes them from the assignment it runs.
    """

    work_id: str
    assignment_id: str
    epoch: int
    reason: str
    checkpoint: bool = False
    tenant: str = ""
    work_kind: WorkKind | Literal[""] = ""


class VerifyWorker(Event, tag="cmd.verify", frozen=True, kw_only=True):
    """Run the verification job of ``worker.verification_requested`` and report the answer."""

    challenge_id: str
    seed: str
    size: int
    rounds: int
    deadline_s: float


class RegistrationRefused(Event, tag="cmd.registration_refused", frozen=True, kw_only=True):
    """The kernel refused the agent's registration (it says ``reason``): the agent stops."""

    reason: str


CommandEvent = StartWork | StopWork | VerifyWorker | RegistrationRefused
