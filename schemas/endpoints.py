"""Events of the ENDPOINTS stream: ``endpoint.<tenant>.<endpoint_id>.<event>``."""

from __future__ import annotations

from typing import Literal

from schemas._base import Event
from schemas.values import AssignmentRevocation, Placement, Pool

Engine = Literal["vllm", "cpu"]
ModelSource = Literal["hub", "workspace"]
"""Where an endpoint's model comes from: a model hub name, or a path in the tenant's workspace."""
Routing = Literal["round_robin", "session", "prefix"]
"""How the gateway picks a replica for a request: in turn; by the caller's session (the OpenAI
``user`` field or an ``x-session-id`` header); by the prompt's leading text (for the prefix cache)."""


class EndpointDeployed(Event, tag="endpoint.deployed", frozen=True, kw_only=True):
    """A tenant deployed an inference endpoint.

    Attributes:
        model: a model name (``HuggingFaceTB/SmolLM2-135M-Instruct``) or, with ``model_source``
            ``workspace``, a path in the tenant's workspace (``model_out/run-1/``).
        gpu_type: a GPU model family, or ``None`` for any (including CPU hosts).
        min_replicas / max_replicas: the autoscaler's bounds.
        target_rps_per_replica: scale out above this load, in below it.
        scale_to_zero_after_s: idle seconds before scaling to zero (``None``: never).
        max_concurrency: requests one replica holds at once; beyond, requests wait in line.
        max_queue: requests that may wait in the endpoint's line (per gateway); more are refused (429).
        queue_timeout_s: how long a request may wait in line (a cold start included) before a 429.
        routing: how a replica is chosen (:data:`Routing`).
        image: the container image of the engine (``None``: the platform's); only workers that run
            images take such an endpoint.
    """

    name: str
    model: str
    gpu_type: str | None = None
    vram_mb: int = 0
    min_replicas: int = 0
    max_replicas: int = 1
    target_rps_per_replica: float = 10.0
    scale_to_zero_after_s: int | None = 300
    pool: Pool = "shared"
    engine: Engine | None = None
    deployed_by: str = ""
    model_source: ModelSource = "hub"
    max_concurrency: int = 8
    max_queue: int = 64
    queue_timeout_s: float = 120.0
    routing: Routing = "round_robin"
    image: str | None = None


class EndpointScaled(Event, tag="endpoint.scaled", frozen=True, kw_only=True):
    """The desired replica count changed; ``inputs`` are what the decision saw (rps, util...).

    Attributes:
        min_replicas / max_replicas: new autoscaling bounds when a tenant set them (``None``:
            unchanged; the autoscaler never sets them).
        by: who set the bounds (empty for the autoscaler).
    """

    replicas: int
    reason: str
    inputs: dict[str, float] = {}
    min_replicas: int | None = None
    max_replicas: int | None = None
    by: str = ""


class EndpointReplicaPlaced(Event, Placement, tag="endpoint.replica_placed", frozen=True, kw_only=True):
    """Replicas were assigned to workers."""


class EndpointReplicaRevoked(
    Event, AssignmentRevocation, tag="endpoint.replica_revoked", frozen=True, kw_only=True
):
    """A replica's assignment was taken back."""


class EndpointReplicaStarting(Event, tag="endpoint.replica_starting", frozen=True, kw_only=True):
    """An agent is starting the engine for a replica."""

    assignment_id: str
    worker_id: str
    epoch: int


class EndpointReplicaReady(Event, tag="endpoint.replica_ready", frozen=True, kw_only=True):
    """A replica passed its health check and serves at ``address`` (``http://host:port``).

    Attributes:
        api_key: the bearer key its engine takes, made by the agent's runtime (empty in events of
            replicas that took none: they are called without). The kernel's to read and send, never a
            tenant's: the gateway leaves it out of every event it shows (:func:`gateway.feed.shown`).
    """

    assignment_id: str
    epoch: int
    address: str
    api_key: str = ""


class EndpointReplicaLost(Event, tag="endpoint.replica_lost", frozen=True, kw_only=True):
    """A replica stopped serving (worker lost, engine died, failed to start).

    Attributes:
        log_tail: the engine's last lines of output, when it ran.
        retryable: not the replica's own failure (its worker was lost, stopped or restarted, or
            refused it): it does not count towards failing the endpoint.
    """

    assignment_id: str
    epoch: int
    reason: str
    log_tail: str = ""
    retryable: bool = False


class EndpointFailed(Event, tag="endpoint.failed", frozen=True, kw_only=True):
    """The coordinator gave up on the endpoint: its replicas kept failing without one becoming ready
    (a bad model path, an engine out of memory). It wants no replica until its tenant scales it.

    Attributes:
        reason: why, with the last replica's reason.
        log_tail: the last failed engine's output.
    """

    reason: str
    log_tail: str = ""


class EndpointScaledToZero(Event, tag="endpoint.scaled_to_zero", frozen=True, kw_only=True):
    """Every replica was removed after ``idle_s`` seconds without a request; billing stops."""

    idle_s: float


class EndpointDeleted(Event, tag="endpoint.deleted", frozen=True, kw_only=True):
    """The endpoint was deleted."""

    by: str


EndpointEvent = (
    EndpointDeployed
    | EndpointScaled
    | EndpointReplicaPlaced
    | EndpointReplicaRevoked
    | EndpointReplicaStarting
    | EndpointReplicaReady
    | EndpointReplicaLost
    | EndpointScaledToZero
    | EndpointDeleted
    | EndpointFailed
)
