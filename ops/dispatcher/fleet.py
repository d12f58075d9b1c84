"""A cluster's nodes as the kernel's workers: who they are, which are alive, and their registration.

Each node becomes one worker whose id is :func:`worker_id_for` (``kernel-``, the cluster's name and
the node's, stable across restarts, one subject token: in the kernel's namespace, which no provider's
agent may enroll, :data:`projections.providers.KERNEL_WORKER_PREFIX`). The dispatcher enrolls it by a
claim on the intake (``provider.<provider>.agent_enrolled``), which the intake accepts from the
cluster's enrolled dispatcher only, for an id of its cluster nobody holds, under the cluster's terms
(provider, pool, region and owner tenant: :func:`ops.enrollment.enroll_cluster`); once the node is
enrolled, it claims its registration, as an agent does: the intake checks the claim against that
enrollment and stores the kernel's ``worker.registered``. A node whose facts change (GPUs added, a new label)
is registered again.

Liveness is the node's ``Ready`` condition (:func:`~ops.dispatcher.nodes.is_ready`): the dispatcher
heartbeats for Ready nodes only, so a node that goes NotReady or vanishes falls silent and the
coordinator's heartbeat deadline marks its worker lost, exactly as for an agent that died.

A cordoned node (``kubectl cordon``: ``spec.unschedulable``) keeps its work and takes no new work: the
dispatcher claims the worker's policy :data:`CORDONED`, in maintenance all week, as any provider may
say of its own host, and the plain policy again once the node is uncordoned. It never says
``worker.cordoned`` or ``worker.uncordoned``: those are the kernel's (its health controller's and its
operators'), so a kernel's cordon outlives a Kubernetes uncordon. Every listed node's policy is
claimed once after each start, since a node may have been uncordoned while the dispatcher was down.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidInput
from ops.dispatcher.names import digest
from ops.dispatcher.nodes import NodeWorker, node_worker, registration
from projections.providers import KERNEL_WORKER_PREFIX
from schemas.values import Pool
from schemas.workers import MaintenanceWindow, WorkerPolicy, WorkerPolicySet, WorkerRegistered

log = logging.getLogger("resontech.dispatcher")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_ID = 64
MINUTES_PER_DAY = 24 * 60
CORDONED = WorkerPolicy(
    maintenance=[
        MaintenanceWindow(weekday=day, start_minute=0, end_minute=MINUTES_PER_DAY) for day in range(7)
    ]
)
"""The policy of a cordoned node's worker: in maintenance every minute of the week (``why`` says the
worker "is in maintenance"), until the node is uncordoned."""


@dataclass(frozen=True)
class Identity:
    """What every node of the dispatcher's cluster registers as (fixed by its enrollment).

    Attributes:
        cluster: the cluster's name: the first part of every node-worker's id.
        provider / pool / region / owner_tenant: as an enrollment token names them.
        version: the dispatcher's version, reported as the worker's agent version.
    """

    cluster: str
    provider: str
    pool: Pool = "shared"
    region: str = ""
    owner_tenant: str | None = None
    version: str = "dev"


def worker_id_for(cluster: str, node: str) -> str:
    """The worker id of ``node``: ``kernel-<cluster>-<node>`` with every character a subject token may
    not hold as ``-``, and a digest of the exact name when anything was changed or cut (two nodes
    never share an id). The prefix puts it where no provider can enroll it first."""
    plain = f"{KERNEL_WORKER_PREFIX}{cluster}-{node}"
    safe = _UNSAFE.sub("-", plain)
    if safe == plain and len(safe) <= MAX_ID:
        return safe
    suffix = digest(cluster, node)
    return f"{safe[: MAX_ID - len(suffix) - 1]}-{suffix}"


@dataclass
class Fleet:
    """The cluster's nodes as last listed: their workers, registrations and readiness."""

    identity: Identity
    nodes: dict[str, NodeWorker] = field(default_factory=dict)
    """worker id -> node, for every node listed last (a vanished node is dropped)."""
    registered: dict[str, WorkerRegistered] = field(default_factory=dict)
    """worker id -> the registration last claimed."""
    refused: dict[str, str] = field(default_factory=dict)
    """worker id -> why the kernel refused its registration (it takes no work and is not beaten for)."""
    policies: dict[str, WorkerPolicy] = field(default_factory=dict)
    """worker id -> the policy last claimed."""

    def update(self, items: Iterable[Mapping[str, Any]]) -> list[tuple[str, WorkerRegistered]]:
        """Read a listing of nodes; the registrations to claim now (new nodes, changed facts)."""
        nodes: dict[str, NodeWorker] = {}
        for item in items:
            try:
                worker = node_worker(item)
            except InvalidInput as exc:
                log.warning("node skipped: %s", exc.message)
                continue
            if worker.problems:
                log.warning("node %s: %s", worker.name, "; ".join(worker.problems))
            nodes[worker_id_for(self.identity.cluster, worker.name)] = worker
        self.nodes = nodes
        due = []
        for worker_id, worker in nodes.items():
            i = self.identity
            event = registration(
                worker,
                provider=i.provider,
                pool=i.pool,
                owner_tenant=i.owner_tenant,
                version=i.version,
                region=i.region,
            )
            if self.registered.get(worker_id) != event and worker_id not in self.refused:
                due.append((worker_id, event))
        return due

    def policies_due(self) -> list[tuple[str, WorkerPolicySet]]:
        """The policies to claim now: :data:`CORDONED` for a registered node newly cordoned, the plain
        policy for one newly uncordoned, and each node's once after a start."""
        due = []
        for worker_id, node in self.nodes.items():
            if worker_id not in self.registered:
                continue  # its registration is claimed first
            policy = CORDONED if node.cordoned else WorkerPolicy()
            if self.policies.get(worker_id) != policy:
                due.append((worker_id, WorkerPolicySet(policy=policy)))
        return due

    def alive(self) -> list[str]:
        """The workers to heartbeat for: listed, registered, Ready, and not refused by the kernel."""
        live = (w for w, node in self.nodes.items() if node.ready and w not in self.refused)
        return [w for w in live if w in self.registered]

    def ready(self, worker_id: str) -> bool:
        """Whether a worker's node was listed last as Ready."""
        node = self.nodes.get(worker_id)
        return node is not None and node.ready

    def node_of(self, worker_id: str) -> str | None:
        """The node of a worker listed last, or ``None``."""
        node = self.nodes.get(worker_id)
        return node.name if node is not None else None

    def address_of(self, worker_id: str) -> str | None:
        """The address of a worker's node listed last (empty if it reported none), or ``None``."""
        node = self.nodes.get(worker_id)
        return node.address if node is not None else None
