"""The rendezvous of a distributed (``torchrun``) job: where its nodes meet, decided by the kernel.

Every shard of a ``ddp`` job is one torchrun node (static rendezvous: ``--nnodes N --node-rank i
--master-addr A --master-port P``). Node 0's TCP store listens on the host of the worker holding
shard 0, at the address that worker registered (loopback in the dev stack).

The port is a pure function of the tenant, the job and the placement epoch, inside
:data:`PORT_RANGE`. Why not let node 0's agent pick a free port and report it: every shard's start
command would then wait for a round trip through the log before it could be sent, and the kernel
would hold commands back. A hash spreads jobs over 2,000 ports, so two jobs whose node 0 shares a
host rarely meet; when the port is taken anyway (another job, another program), node 0's agent
refuses to start with a retryable failure, the kernel restarts the gang at the next epoch, and the
next epoch hashes to another port. A restart after a lost worker moves to a new port too, so a node
of the old epoch still shutting down never holds the new one.

Providers open :data:`PORT_RANGE` between their hosts (gloo and NCCL also connect the ranks on
ephemeral ports).
"""

from __future__ import annotations

import hashlib

from schemas.commands import Rendezvous, WorkSpec

PORT_RANGE = range(29500, 31500)
"""Master ports the kernel hands out (29500 is torchrun's own default)."""
RDZV_TIMEOUT_S = 300
"""How long a node waits for the others at the rendezvous (torchrun's default is 600)."""


def master_port(tenant: str, job_id: str, epoch: int) -> int:
    """The master port of one placement of a job: stable for ``(tenant, job_id, epoch)``."""
    digest = hashlib.blake2b(f"{tenant}/{job_id}/{epoch}".encode(), digest_size=8).digest()
    return PORT_RANGE.start + int.from_bytes(digest, "big") % len(PORT_RANGE)


def rendezvous(
    *, tenant: str, job_id: str, epoch: int, master_addr: str, nnodes: int, node_rank: int, gpus: int
) -> Rendezvous:
    """The rendezvous of node ``node_rank`` of a placement.

    Args:
        master_addr: the address of the worker holding shard 0.
        nnodes: the job's shard count.
        node_rank: the shard's slot.
        gpus: GPUs per shard: that many ranks per node on ``nccl``; 0 means one rank on ``gloo``.
    """
    return Rendezvous(
        master_addr=master_addr,
        master_port=master_port(tenant, job_id, epoch),
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=max(1, gpus),
        backend="nccl" if gpus > 0 else "gloo",
        timeout_s=RDZV_TIMEOUT_S,
    )


def rank_env(spec: WorkSpec, rdzv: Rendezvous) -> dict[str, str]:
    """What every rank of a node is told besides torchrun's own variables: the collective backend
    (``RESONTECH_DDP_BACKEND``), how the job shards the model (``RESONTECH_STRATEGY``: ``ddp`` or
    ``fsdp``) and its CPU threads (``OMP_NUM_THREADS``: the shard's CPUs shared by its ranks, at least
    one; torch would otherwise take every core of the host)."""
    return {
        "RESONTECH_DDP_BACKEND": rdzv.backend,
        "RESONTECH_STRATEGY": spec.options.get("strategy", "ddp"),
        "OMP_NUM_THREADS": str(max(1, int(spec.cpus // rdzv.nproc_per_node))),
    }
