"""Inference endpoints, the lifecycle a tenant controls: deploy, scale, delete, list, get.

Serving (placement of replicas, engines, the OpenAI-compatible routes, autoscaling) is the inference
issue's; here a deployment is checked like a job (the model's workspace objects exist, the tenant's
quota and the fleet could ever hold its first replicas) and each change is one event on the
endpoint's subjects, appended with the endpoint's expected sequence (:mod:`gateway.resources`: an
acknowledged change is never a 5xx but, while this gateway's projection has not applied it, a ``202
Accepted`` with the endpoint as the projection will hold it; a retried deployment with the same
``Idempotency-Key`` answers with the same endpoint). Reads come from the live ENDPOINTS projection;
an endpoint's hour of traffic from this gateway's proxy (:mod:`gateway.traffic_history`) and its
replica counts from its events (:mod:`gateway.scale_history`).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from starlette.responses import Response

from core import hub
from core.objects import bucket_for
from core.streams import endpoint_filter, endpoint_subject
from gateway.api import Call, Router, respond
from gateway.bodies import carried, converted
from gateway.errors import ApiError, conflict
from gateway.jobspec import idle_fleet
from gateway.references import key_problem, require_objects
from gateway.resources import Resource, stop_work
from gateway.scale_history import ScaleHistory
from gateway.scope import iso
from gateway.traffic_history import BUCKET_S
from projections import ENDPOINTS, REGISTRY, TENANTS
from projections.admission import Wait, check_quota, never_fits, replica_gpus, request_for_endpoint
from projections.endpoints import EndpointRecord, EndpointsState, deployed, endpoint_key, ready_replicas
from projections.tenants import quotas
from schemas.api.endpoints import (
    DEFAULT_SCALE_TO_ZERO_S,
    DeployEndpoint,
    Endpoint,
    EndpointListQuery,
    EndpointPage,
    Replica,
    ReplicaCount,
    ScaleEndpoint,
    ScaleEvent,
    Traffic,
    TrafficBucket,
    TrafficHistory,
    TrafficQuery,
)
from schemas.api.jobs import TenantQuery
from schemas.endpoints import EndpointDeleted, EndpointDeployed, EndpointScaled
from schemas.values import WorkKind

router = Router("endpoints")
CHANGE_ATTEMPTS = 5
ACCEPTED = (
    "stored, but this gateway has not applied it yet: the body is the endpoint as it will read once "
    "applied (GET it shortly instead of retrying)"
)


def endpoint_view(e: EndpointRecord, traffic: Traffic | None = None) -> Endpoint:
    """The API body of an endpoint record (with its traffic figures when given)."""
    return carried(
        Endpoint,
        e,
        ready_replicas=len(ready_replicas(e)),
        replicas=[carried(Replica, r) for r in sorted(e.replicas.values(), key=lambda r: r.slot)],
        deployed_at=iso(e.deployed_ns),
        deleted_at=iso(e.deleted_ns) if e.deleted_ns is not None else None,
        traffic=traffic or Traffic(),
    )


def traffic_of(call: Call[Any, Any], e: EndpointRecord) -> Traffic:
    """The endpoint's figures from this gateway's inference proxy (:mod:`gateway.inference`)."""
    return carried(Traffic, call.request.app.state.inference.figures(endpoint_key(e.tenant, e.endpoint_id)))


def _invalid(message: str, code: str = "invalid_spec") -> ApiError:
    return ApiError(422, code, message)


def _check_bounds(low: int, high: int) -> None:
    if low > high:
        raise _invalid(f"min_replicas ({low}) is above max_replicas ({high})")


def deployment(body: DeployEndpoint, deployed_by: str) -> EndpointDeployed:
    """The ``endpoint.deployed`` of a body that passes every rule that needs no state; 422 otherwise."""
    _check_bounds(body.min_replicas, body.max_replicas)
    if body.model_source == "hub":
        try:
            hub.parse(body.model)
        except hub.InvalidRepoReference as exc:
            raise _invalid(
                f"model {body.model!r} is not a model name like org/name[@revision] ({exc.message}); for a "
                "workspace path send model_source 'workspace'"
            ) from None
    if body.model_source == "workspace" and (problem := key_problem(body.model)) is not None:
        raise _invalid(f"bad model path: {problem}", "invalid_key")
    if body.engine == "cpu" and (body.gpu_type or body.vram_mb):
        raise _invalid("engine 'cpu' runs without GPUs; drop gpu_type and vram_mb, or choose engine 'vllm'")
    timeout = body.scale_to_zero_after_s
    if body.min_replicas > 0 and timeout is not msgspec.UNSET and timeout is not None:
        raise _invalid(
            "scale_to_zero_after_s needs min_replicas 0: an endpoint with a minimum never idles to zero"
        )
    if timeout is msgspec.UNSET:
        timeout = DEFAULT_SCALE_TO_ZERO_S if body.min_replicas == 0 else None
    return converted(EndpointDeployed, body, scale_to_zero_after_s=timeout, deployed_by=deployed_by)


def check_admission(call: Call[Any, Any], endpoint: EndpointRecord) -> None:
    """422 when the endpoint's wanted replicas could never run: over the tenant's whole quota, or
    more than the fleet could ever hold (the coordinator's own rules)."""
    want = endpoint.desired_replicas
    gpus = want * replica_gpus(endpoint)
    limits = quotas(call.kernel.state(TENANTS))
    verdict = check_quota(endpoint.tenant, endpoint.spec.pool, gpus, limits, {}, whole=gpus)
    if isinstance(verdict, Wait) and verdict.permanent:
        limit = limits.get(endpoint.tenant, {}).get(endpoint.spec.pool)
        raise _invalid(
            f"{want} replica(s) need {gpus} GPUs but the tenant's quota in the {endpoint.spec.pool} pool is "
            f"{limit}; lower min_replicas or ask the operator to raise the quota",
            "over_quota",
        )
    request = request_for_endpoint(endpoint, slots=list(range(want)), epoch=1)
    now_ns = time.time_ns()
    reason = never_fits(request, idle_fleet(call).hosts(call.kernel.state(REGISTRY), now_ns), now_ns)
    if reason is not None:
        raise _invalid(f"this endpoint could never be placed: {reason}", "unplaceable")


ENDPOINT: Resource[EndpointRecord] = Resource(
    noun="endpoint",
    id_prefix="ep",
    projection=ENDPOINTS,
    subject=endpoint_subject,
    subjects=endpoint_filter,
    key=endpoint_key,
    table=lambda state: state.endpoints,
    alone=lambda seq, endpoints: EndpointsState(seq=seq, endpoints=endpoints),
    view=endpoint_view,
    sender="deployed_by",
    exists="choose another endpoint_id, or leave it out",
    reused="this Idempotency-Key was used for a different deployment; send a new key",
)
"""Endpoints in the log: deployed once, scaled and deleted with the endpoint's expected sequence."""


@router.post(
    "/v1/endpoints",
    role="member",
    body=DeployEndpoint,
    query=TenantQuery,
    response=Endpoint,
    status=201,
    errors={
        409: "the endpoint id, or a live endpoint's name, is taken",
        422: "the deployment cannot run: missing_objects, invalid_spec, invalid_key, over_quota, "
        "unplaceable, idempotency_key_reused",
    },
    accepted=f"the endpoint.deployed event is {ACCEPTED}",
)
async def deploy_endpoint(call: Call[DeployEndpoint, TenantQuery]) -> Any:
    """Deploy an inference endpoint (send an Idempotency-Key to retry safely)."""
    kernel = call.kernel
    tenant, endpoint_id, eid = ENDPOINT.named(call, call.body.endpoint_id)
    event = deployment(call.body, call.principal.label)
    table = kernel.state(ENDPOINTS).endpoints
    if endpoint_key(tenant, endpoint_id) in table:
        return await ENDPOINT.replay(call, tenant, endpoint_id, event, eid)
    for other in table.values():
        if other.tenant == tenant and other.spec.name == event.name and other.state != "deleted":
            raise conflict(
                f"endpoint {other.endpoint_id} is already named {event.name!r}; "
                "delete it or choose another name"
            )
    check_admission(call, deployed(tenant, endpoint_id, event))
    if event.model_source == "workspace":
        await require_objects(kernel.s3, bucket_for(tenant), [event.model], kernel.seen_objects)
    return await ENDPOINT.create(call, tenant, endpoint_id, event, eid)


@router.get("/v1/endpoints", query=EndpointListQuery, response=EndpointPage)
async def list_endpoints(call: Call[None, EndpointListQuery]) -> EndpointPage:
    """The tenant's endpoints, newest first (deleted ones with include_deleted or state=deleted)."""
    q = call.query
    page, next_cursor = ENDPOINT.listed(
        call,
        lambda e: e.state == q.state if q.state is not None else q.include_deleted or e.state != "deleted",
        lambda e: e.deployed_seq,
    )
    return EndpointPage(items=[endpoint_view(e, traffic_of(call, e)) for e in page], next=next_cursor)


@router.get("/v1/endpoints/{endpoint_id}", query=TenantQuery, response=Endpoint)
async def get_endpoint(call: Call[None, TenantQuery]) -> Endpoint:
    """One endpoint with its replicas and their states."""
    record = ENDPOINT.visible(call)
    return endpoint_view(record, traffic_of(call, record))


@router.get("/v1/endpoints/{endpoint_id}/traffic", query=TrafficQuery, response=TrafficHistory)
async def endpoint_traffic(call: Call[None, TrafficQuery]) -> TrafficHistory:
    """The endpoint's traffic through this gateway in 10-second buckets, and its replica counts and
    scale events from the log, over the last ``window_s`` seconds (default: the hour kept)."""
    record = ENDPOINT.visible(call)
    now, window = time.time(), call.query.window_s
    buckets = call.request.app.state.inference.history.window(
        endpoint_key(record.tenant, record.endpoint_id), now, window
    )
    history: ScaleHistory = call.request.app.state.scale_history
    steps, marks = await history.window(call.kernel.event_log, record, now, window)
    return TrafficHistory(
        endpoint_id=record.endpoint_id,
        window_s=window,
        bucket_s=BUCKET_S,
        now=now,
        traffic=[carried(TrafficBucket, b, t=b.start, queue_depth=b.depth) for b in buckets],
        replicas=[carried(ReplicaCount, step) for step in steps],
        scale_events=[carried(ScaleEvent, mark, type=mark.kind) for mark in marks],
    )


async def _change(call: Call[Any, Any], endpoint: EndpointRecord, decide: Any) -> tuple[EndpointRecord, int]:
    """Append ``decide(endpoint)`` with the endpoint's expected sequence, re-reading and deciding
    again when something else was appended first. Returns the endpoint after it (unchanged when
    ``decide`` returns ``None``: nothing left to do) and the status to answer: 200, or 202 when the
    change is stored but this gateway has not applied it."""
    for _ in range(CHANGE_ATTEMPTS):
        event = decide(endpoint)
        if event is None:
            return endpoint, 200
        changed = await ENDPOINT.change(call, endpoint, endpoint.tenant, endpoint.endpoint_id, event)
        if changed is not None:
            return changed
        endpoint = await ENDPOINT.fresh(call, endpoint.tenant, endpoint.endpoint_id)
    raise ApiError(503, "busy", f"endpoint {endpoint.endpoint_id} kept changing; retry")


def _not_deleted(endpoint: EndpointRecord) -> None:
    if endpoint.state == "deleted":
        raise ApiError(
            409, "endpoint_deleted", f"endpoint {endpoint.endpoint_id} was deleted; deploy a new one"
        )


@router.put(
    "/v1/endpoints/{endpoint_id}/scale",
    role="member",
    body=ScaleEndpoint,
    query=TenantQuery,
    response=Endpoint,
    errors={409: "the endpoint was deleted", 422: "invalid_spec, over_quota, unplaceable"},
    accepted=f"the endpoint.scaled event is {ACCEPTED}",
)
async def scale_endpoint(call: Call[ScaleEndpoint, TenantQuery]) -> Any:
    """Set the endpoint's min/max replicas; the desired count is brought inside the new bounds. A
    failed endpoint is tried again (with min_replicas 0, on its next request)."""
    endpoint = ENDPOINT.visible(call)
    low, high = call.body.min_replicas, call.body.max_replicas
    _check_bounds(low, high)
    _not_deleted(endpoint)
    call.resource = endpoint.endpoint_id
    check_admission(
        call,
        msgspec.structs.replace(endpoint, desired_replicas=min(max(endpoint.desired_replicas, low), high)),
    )

    def decide(current: EndpointRecord) -> EndpointScaled:
        _not_deleted(current)
        return EndpointScaled(
            replicas=min(max(current.desired_replicas, low), high),
            reason=f"replica bounds set to {low}..{high} by {call.principal.label}",
            min_replicas=low,
            max_replicas=high,
            by=call.principal.label,
        )

    record, status = await _change(call, endpoint, decide)
    return respond(endpoint_view(record), status)


@router.delete(
    "/v1/endpoints/{endpoint_id}",
    role="member",
    query=TenantQuery,
    status=204,
    accepted="the endpoint.deleted event is stored, but this gateway has not applied it yet (the "
    "replicas were told to stop all the same)",
)
async def delete_endpoint(call: Call[None, TenantQuery]) -> Response:
    """Delete an endpoint: its replicas are told to stop (deleting it again changes nothing)."""
    endpoint = ENDPOINT.visible(call)
    call.resource = endpoint.endpoint_id
    deleted = EndpointDeleted(by=call.principal.label)

    def decide(current: EndpointRecord) -> EndpointDeleted | None:
        return None if current.state == "deleted" else deleted

    endpoint, status = await _change(call, endpoint, decide)
    live = [replica for replica in endpoint.replicas.values() if replica.state != "lost"]
    reason = f"endpoint deleted by {endpoint.deleted_by}"
    work: tuple[str, WorkKind, str] = (endpoint.tenant, "endpoint", endpoint.endpoint_id)
    await stop_work(call, work, live, reason, "delete")
    return respond(None, 204 if status == 200 else status)
