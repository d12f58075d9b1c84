"""Bodies of the endpoints routes: deploy, scale, and the endpoint with its replicas.

Serving itself (the OpenAI-compatible routes, the autoscaler, the engines) lives elsewhere;
these bodies are the lifecycle a tenant controls.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, UnsetType

from schemas.api.common import Page, PageQuery, Request
from schemas.api.jobs import Image, Pool, Token
from schemas.endpoints import EndpointDeployed, Routing

EndpointName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
"""Letters, digits, ``.``, ``-`` and ``_``, 1-64 characters: what clients name as ``model``."""
Replicas = Annotated[int, msgspec.Meta(ge=0, le=64)]
EndpointStateName = Literal["deploying", "serving", "scaled_to_zero", "failed", "deleted"]
DEFAULT_SCALE_TO_ZERO_S = 300


class DeployEndpoint(Request, frozen=True, kw_only=True):
    """An inference endpoint to deploy.

    Attributes:
        name: unique among the tenant's live endpoints.
        endpoint_id: default generated (derived from the ``Idempotency-Key`` when one is sent).
        model: a model name (``HuggingFaceTB/SmolLM2-135M-Instruct``) or, with ``model_source``
            ``workspace``, a workspace key or prefix (``model_out/run-1/``) that must exist.
        gpu_type / vram_mb: per replica (``null`` / 0: any, a CPU host included).
        engine: ``vllm``, ``cpu`` or ``null`` (the platform chooses by the host).
        min_replicas / max_replicas: the autoscaler's bounds (default 0..1); a new endpoint
            starts one replica even with ``min_replicas`` 0.
        target_rps_per_replica: requests per second a replica should take before scaling out.
        scale_to_zero_after_s: idle seconds before scaling to zero, ``null`` for never; only with
            ``min_replicas`` 0 (default 300 then).
        max_concurrency: requests one replica holds at once (default 8); beyond that they wait in
            the endpoint's line.
        max_queue: requests that may wait in line (default 64, per gateway); beyond, 429.
        queue_timeout_s: seconds a request may wait in line, a cold start included (default 120);
            beyond, 429.
        routing: ``round_robin`` (default), ``session`` (the same OpenAI ``user``, or
            ``x-session-id`` header, goes to the same replica while it serves) or ``prefix`` (the
            same leading prompt text goes to the same replica, for its prefix cache, within a bound
            on load imbalance).
        image: the engine's container image (a vLLM build of your own, say). Only workers that run
            images take such an endpoint: today the nodes of the kernel's own Kubernetes clusters.
            Default: the platform's engine.
    """

    name: EndpointName
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    model_source: Literal["hub", "workspace"] = "hub"
    endpoint_id: Token | None = None
    gpu_type: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    vram_mb: Annotated[int, msgspec.Meta(ge=0, le=4_194_304)] = 0
    engine: Literal["vllm", "cpu"] | None = None
    pool: Pool = "shared"
    min_replicas: Replicas = 0
    max_replicas: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    target_rps_per_replica: Annotated[float, msgspec.Meta(gt=0, le=100_000)] = 10.0
    scale_to_zero_after_s: Annotated[int, msgspec.Meta(ge=10, le=604_800)] | UnsetType | None = UNSET
    max_concurrency: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 8
    max_queue: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 64
    queue_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 120.0
    routing: Routing = "round_robin"
    image: Image | None = None


class ScaleEndpoint(Request, frozen=True, kw_only=True):
    """New autoscaling bounds; the desired replica count is brought inside them."""

    min_replicas: Replicas
    max_replicas: Annotated[int, msgspec.Meta(ge=1, le=64)]


class EndpointListQuery(PageQuery, frozen=True, kw_only=True):
    """Filters of ``GET /v1/endpoints``, newest first; deleted endpoints only when asked for."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=200)] = 50
    tenant: str | None = None
    state: EndpointStateName | None = None
    include_deleted: bool = False


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    """One replica: ``placed`` -> ``starting`` -> ``ready`` (serving at ``address``), or ``lost``
    (``reason``, and the engine's last lines of output in ``log_tail``) until it is replaced."""

    slot: int
    worker_id: str
    assignment_id: str
    epoch: int
    gpus: int
    state: str
    address: str
    reason: str
    log_tail: str = ""


class Traffic(msgspec.Struct, frozen=True, kw_only=True):
    """An endpoint's inference traffic through this gateway over the last 60 s (latencies in ms,
    from a request's arrival to the last byte of its response, its wait in line included).

    Attributes:
        queue_depth / in_flight: requests waiting in the endpoint's line, and held by its replicas,
            now.
        wait_p50_ms / wait_p99_ms: time in line of the requests that left it for a replica.
        rejected: requests answered 429 (line full, or waited past ``queue_timeout_s``).
    """

    requests: int = 0
    rps: float = 0.0
    error_rate: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    queue_depth: int = 0
    in_flight: int = 0
    wait_p50_ms: float = 0.0
    wait_p99_ms: float = 0.0
    rejected: int = 0


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    """An endpoint as the API shows it: its deployment whole (``spec``) and what has happened since.

    Attributes:
        spec: the ``endpoint.deployed`` event as stored (with ``deployed_by``), with the autoscaling
            bounds its tenant set since.
        state: ``deploying``, ``serving``, ``scaled_to_zero``, ``failed`` (its replicas kept failing
            to start: ``scale_reason`` says why; it wants no replica until its tenant scales it) or
            ``deleted``.
        start_failures: replicas lost in a row by their own failure, none ready since.
        last_failure / last_failure_log_tail: the latest such replica's reason and engine output.
    """

    endpoint_id: str
    tenant: str
    spec: EndpointDeployed
    state: str
    desired_replicas: int
    ready_replicas: int
    scale_reason: str
    replicas: list[Replica]
    start_failures: int = 0
    last_failure: str = ""
    last_failure_log_tail: str = ""
    deployed_at: str
    deleted_by: str
    deleted_at: str | None
    traffic: Traffic = Traffic()


EndpointPage = Page[Endpoint]
HISTORY_WINDOW_S = 3600
"""The longest window of ``GET /v1/endpoints/{endpoint_id}/traffic``: the hour a gateway keeps."""


class TrafficQuery(Request, frozen=True, kw_only=True):
    """The window of an endpoint's traffic history: the last ``window_s`` seconds (60-3600, default
    3600)."""

    tenant: str | None = None
    window_s: Annotated[int, msgspec.Meta(ge=60, le=HISTORY_WINDOW_S)] = HISTORY_WINDOW_S


class TrafficBucket(msgspec.Struct, frozen=True, kw_only=True):
    """An endpoint's inference traffic through this gateway in one bucket of ``bucket_s`` seconds.

    Attributes:
        t: the bucket's start, Unix seconds.
        requests / errors: requests finished in it, and those that failed (5xx, or no replica).
        rps: requests per second (over the time elapsed, for the bucket still open).
        p50_ms / p95_ms / p99_ms: latency percentiles, arrival to last byte, within 2.5% (a
            log-scale histogram); ``null`` when no request finished in the bucket.
        wait_p50_ms / wait_p99_ms: time in line for a replica slot, likewise.
        queue_depth: the most requests waiting in the endpoint's line at once.
        rejected: requests answered 429 (line full, or waited past ``queue_timeout_s``).
    """

    t: int
    requests: int
    errors: int
    rps: float
    error_rate: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    wait_p50_ms: float | None
    wait_p99_ms: float | None
    queue_depth: int
    rejected: int


class ReplicaCount(msgspec.Struct, frozen=True, kw_only=True):
    """From ``t`` (Unix seconds) until the next count, ``wanted`` replicas were wanted and ``ready``
    served."""

    t: float
    wanted: int
    ready: int


class ScaleEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event of the endpoint that changed its scale: its ENDPOINTS sequence, time (Unix seconds),
    ``type`` (``endpoint.scaled``, ``endpoint.scaled_to_zero``, ``endpoint.replica_lost``...) and
    what it did."""

    t: float
    seq: int
    type: str
    label: str


class TrafficHistory(msgspec.Struct, frozen=True, kw_only=True):
    """An endpoint over the last ``window_s`` seconds.

    Attributes:
        traffic: buckets in which this gateway proxied, refused or queued a request of the
            endpoint, oldest first (a bucket absent: nothing happened); the last may still be open.
            Only this gateway's traffic, kept in its memory: another gateway counts its own, and a
            restarted gateway starts empty.
        replicas: the wanted and ready replica counts, each from its ``t`` on (the first one is
            the count at the window's start), from the endpoint's events in the log.
        scale_events: deployed, scaled, scaled to zero, replica lost, failed, deleted.
        now: the gateway's time of the answer, Unix seconds.
    """

    endpoint_id: str
    window_s: int
    bucket_s: int
    now: float
    traffic: list[TrafficBucket]
    replicas: list[ReplicaCount]
    scale_events: list[ScaleEvent]
