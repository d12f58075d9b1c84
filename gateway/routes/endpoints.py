"""Inference endpoints, the lifecycle a tenant controls: deploy, scale, delete, list, get.

Serving (placement of replicas, engines, the OpenAI-compatible routes, autoscaling) is the inference
issue's; here a deployment is checked like a job (the model's workspace objects exist, the tenant's
quota and the fleet could ever hold its first replicas) and each change is one event on the
endpoint's subjects, appended with the endpoint's expected sequence. Reads come from the live
ENDPOINTS projection.

Once the log has acknowledged a change the answer is never a 5xx (which would invite a retry, and a
second endpoint for a deployment without ``Idempotency-Key``): if this gateway's projection has not
applied it within :data:`gateway.kernel.READ_YOUR_WRITES_S`, the answer is ``202 Accepted`` with the
endpoint as the projection will hold it (:func:`as_applied`), and a retried deployment with the
same key answers with the same endpoint.
"""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec
from starlette.responses import Response

from core.errors import ConcurrencyConflict
from core.objects import bucket_for
from core.streams import command_subject, endpoint_filter, endpoint_subject
from core.wire import Position
from gateway.api import Call, Router, respond
from gateway.errors import ApiError, NotYetVisible, conflict, not_found
from gateway.idempotency import REPLAYED_HEADER, event_id, idempotency_key, resource_id
from gateway.jobspec import event_of, idle_fleet
from gateway.paging import decode_seq_cursor, encode_cursor
from gateway.references import key_problem, require_objects
from gateway.scope import iso, scoped_tenant
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
    ScaleEndpoint,
    Traffic,
)
from schemas.api.jobs import TenantQuery
from schemas.commands import StopWork
from schemas.endpoints import EndpointDeleted, EndpointDeployed, EndpointScaled
from schemas.envelope import Recorded

router = Router("endpoints")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
CHANGE_ATTEMPTS = 5
ACCEPTED = (
    "stored, but this gateway has not applied it yet: the body is the endpoint as it will read once "
    "applied (GET it shortly instead of retrying)"
)


def endpoint_view(e: EndpointRecord, traffic: Traffic | None = None) -> Endpoint:
    """The API body of an endpoint record (with its traffic figures when given)."""
    return Endpoint(
        endpoint_id=e.endpoint_id,
        tenant=e.tenant,
        spec=e.spec,
        state=e.state,
        desired_replicas=e.desired_replicas,
        ready_replicas=len(ready_replicas(e)),
        scale_reason=e.scale_reason,
        replicas=[
            Replica(
                slot=r.slot,
                worker_id=r.worker_id,
                assignment_id=r.assignment_id,
                epoch=r.epoch,
                gpus=r.gpus,
                state=r.state,
                address=r.address,
                reason=r.reason,
                log_tail=r.log_tail,
            )
            for r in sorted(e.replicas.values(), key=lambda r: r.slot)
        ],
        start_failures=e.start_failures,
        last_failure=e.last_failure,
        last_failure_log_tail=e.last_failure_log_tail,
        deployed_at=iso(e.deployed_ns),
        deleted_by=e.deleted_by,
        deleted_at=iso(e.deleted_ns) if e.deleted_ns is not None else None,
        traffic=traffic or Traffic(),
    )


def traffic_of(call: Call[Any, Any], e: EndpointRecord) -> Traffic:
    """The endpoint's figures from this gateway's inference proxy (:mod:`gateway.inference`)."""
    f = call.request.app.state.inference.figures(endpoint_key(e.tenant, e.endpoint_id))
    return Traffic(requests=f.requests, rps=f.rps, error_rate=f.error_rate,
                   p50_ms=f.p50_ms, p95_ms=f.p95_ms, p99_ms=f.p99_ms)  # fmt: skip


def _invalid(message: str, code: str = "invalid_spec") -> ApiError:
    return ApiError(422, code, message)


def _check_bounds(low: int, high: int) -> None:
    if low > high:
        raise _invalid(f"min_replicas ({low}) is above max_replicas ({high})")


def deployment(body: DeployEndpoint, deployed_by: str) -> EndpointDeployed:
    """The ``endpoint.deployed`` of a body that passes every rule that needs no state; 422 otherwise."""
    _check_bounds(body.min_replicas, body.max_replicas)
    if body.model_source == "hub" and not _MODEL_NAME.match(body.model):
        raise _invalid(
            f"model {body.model!r} is not a model name like org/name; for a workspace path send "
            "model_source 'workspace'"
        )
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
    return event_of(body, EndpointDeployed, scale_to_zero_after_s=timeout, deployed_by=deployed_by)


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


def as_applied(endpoint: EndpointRecord | None, record: Recorded[Any]) -> EndpointRecord:
    """The endpoint as the projection will hold it once it applies ``record``, from ``endpoint`` as
    known (``None`` for a deployment): the pure reducer on a state holding that endpoint alone."""
    key = endpoint_key(record.token(1), record.token(2))
    known = {key: endpoint} if endpoint else {}
    state = EndpointsState(seq=endpoint.last_seq if endpoint else 0, endpoints=known)
    return ENDPOINTS.evolve(state, record).endpoints[key]


def visible_endpoint(call: Call[Any, Any]) -> EndpointRecord:
    """The endpoint named in the path, in the caller's tenant; 404 otherwise."""
    tenant = scoped_tenant(call, call.query.tenant)
    endpoint_id = call.params["endpoint_id"]
    endpoint: EndpointRecord | None = call.kernel.state(ENDPOINTS).endpoints.get(
        endpoint_key(tenant, endpoint_id)
    )
    if endpoint is None:
        raise not_found(f"endpoint {endpoint_id}")
    return endpoint


async def _replay(
    call: Call[Any, Any], tenant: str, endpoint_id: str, event: EndpointDeployed, eid: str | None
) -> Any:
    """The same endpoint again for a retry of the request that deployed it, else a 409."""
    subject = endpoint_subject(tenant, endpoint_id, EndpointDeployed)
    stored = await call.kernel.event_log.get_last("ENDPOINTS", subject)
    if eid is None or stored is None or stored.msg_id != eid:
        raise conflict(f"endpoint {endpoint_id} exists; choose another endpoint_id, or leave it out")
    if stored.event != msgspec.structs.replace(event, deployed_by=stored.event.deployed_by):
        raise ApiError(
            422,
            "idempotency_key_reused",
            "this Idempotency-Key was used for a different deployment; send a new key",
        )
    call.resource = endpoint_id
    try:
        await call.kernel.visible(ENDPOINTS, Position(stored.stream, stored.seq))
        record = call.kernel.state(ENDPOINTS).endpoints[endpoint_key(tenant, endpoint_id)]
        response = respond(endpoint_view(record), 201)
    except NotYetVisible:
        response = respond(endpoint_view(as_applied(None, stored)), 202)
    response.headers[REPLAYED_HEADER] = "true"
    return response


async def _store_deployment(
    call: Call[Any, Any], tenant: str, endpoint_id: str, event: EndpointDeployed, eid: str | None
) -> Any:
    """Append ``endpoint.deployed`` (endpoint id taken once) and answer: 201 with the endpoint, 202
    while this gateway has not applied it, or the replay of an earlier attempt of the same request."""
    subject = endpoint_subject(tenant, endpoint_id, event)
    try:
        position = await call.kernel.append(
            subject, event, event_id=eid, expected_seq=0,
            expected_filter=endpoint_filter(tenant, endpoint_id), visible_in=ENDPOINTS,
        )  # fmt: skip
    except ConcurrencyConflict:
        return await _replay(call, tenant, endpoint_id, event, eid)
    except NotYetVisible as pending:
        if pending.position.duplicate:  # a retry's first attempt stored it: same checks as any replay
            return await _replay(call, tenant, endpoint_id, event, eid)
        call.resource = endpoint_id
        record = as_applied(None, await call.kernel.stored_record(pending.position, subject, event, eid))
        return respond(endpoint_view(record), 202)
    if position.duplicate:
        return await _replay(call, tenant, endpoint_id, event, eid)
    call.resource = endpoint_id
    return endpoint_view(call.kernel.state(ENDPOINTS).endpoints[endpoint_key(tenant, endpoint_id)])


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
    tenant = scoped_tenant(call, call.query.tenant)
    key = idempotency_key(call.request)
    endpoint_id = call.body.endpoint_id or resource_id("ep", tenant, key)
    eid = event_id("endpoint", tenant, endpoint_id, key)
    event = deployment(call.body, call.principal.label)
    table = kernel.state(ENDPOINTS).endpoints
    if endpoint_key(tenant, endpoint_id) in table:
        return await _replay(call, tenant, endpoint_id, event, eid)
    for other in table.values():
        if other.tenant == tenant and other.spec.name == event.name and other.state != "deleted":
            raise conflict(
                f"endpoint {other.endpoint_id} is already named {event.name!r}; "
                "delete it or choose another name"
            )
    check_admission(call, deployed(tenant, endpoint_id, event))
    if event.model_source == "workspace":
        await require_objects(kernel.s3, bucket_for(tenant), [event.model], kernel.seen_objects)
    return await _store_deployment(call, tenant, endpoint_id, event, eid)


@router.get("/v1/endpoints", query=EndpointListQuery, response=EndpointPage)
async def list_endpoints(call: Call[None, EndpointListQuery]) -> EndpointPage:
    """The tenant's endpoints, newest first (deleted ones with include_deleted or state=deleted)."""
    q = call.query
    tenant = scoped_tenant(call, q.tenant)
    before = decode_seq_cursor("endpoints", q.after) if q.after is not None else None
    found = [
        e
        for e in call.kernel.state(ENDPOINTS).endpoints.values()
        if e.tenant == tenant
        and (before is None or e.deployed_seq < before)
        and (e.state == q.state if q.state is not None else q.include_deleted or e.state != "deleted")
    ]
    found.sort(key=lambda e: e.deployed_seq, reverse=True)
    page = found[: q.limit]
    more = len(found) > q.limit
    return EndpointPage(
        items=[endpoint_view(e, traffic_of(call, e)) for e in page],
        next=encode_cursor("endpoints", page[-1].deployed_seq) if more else None,
    )


@router.get("/v1/endpoints/{endpoint_id}", query=TenantQuery, response=Endpoint)
async def get_endpoint(call: Call[None, TenantQuery]) -> Endpoint:
    """One endpoint with its replicas and their states."""
    record = visible_endpoint(call)
    return endpoint_view(record, traffic_of(call, record))


async def _change(call: Call[Any, Any], endpoint: EndpointRecord, decide: Any) -> tuple[EndpointRecord, int]:
    """Append ``decide(endpoint)`` with the endpoint's expected sequence, re-reading and deciding
    again when something else was appended first. Returns the endpoint after it (unchanged when
    ``decide`` returns ``None``: nothing left to do) and the status to answer: 200, or 202 when the
    change is stored but this gateway has not applied it (the endpoint is then :func:`as_applied`:
    exact, since nothing of the endpoint was appended in between)."""
    key = endpoint_key(endpoint.tenant, endpoint.endpoint_id)
    for _ in range(CHANGE_ATTEMPTS):
        event = decide(endpoint)
        if event is None:
            return endpoint, 200
        subject = endpoint_subject(endpoint.tenant, endpoint.endpoint_id, event)
        try:
            await call.kernel.append(
                subject,
                event,
                expected_seq=endpoint.last_seq,
                expected_filter=endpoint_filter(endpoint.tenant, endpoint.endpoint_id),
                visible_in=ENDPOINTS,
            )
        except ConcurrencyConflict:
            last = await call.kernel.event_log.last_seq("ENDPOINTS")
            try:
                await call.kernel.visible(ENDPOINTS, Position("ENDPOINTS", last))
            except NotYetVisible:  # nothing of this request is stored: a retry is safe
                raise ApiError(503, "busy", f"endpoint {endpoint.endpoint_id} is changing; retry") from None
            endpoint = call.kernel.state(ENDPOINTS).endpoints[key]
            continue
        except NotYetVisible as pending:
            stored = await call.kernel.stored_record(pending.position, subject, event)
            return as_applied(endpoint, stored), 202
        return call.kernel.state(ENDPOINTS).endpoints[key], 200
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
    endpoint = visible_endpoint(call)
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
    endpoint = visible_endpoint(call)
    call.resource = endpoint.endpoint_id
    deleted = EndpointDeleted(by=call.principal.label)

    def decide(current: EndpointRecord) -> EndpointDeleted | None:
        return None if current.state == "deleted" else deleted

    endpoint, status = await _change(call, endpoint, decide)
    for replica in endpoint.replicas.values():
        if replica.state != "lost":
            stop = StopWork(
                work_id=endpoint.endpoint_id,
                assignment_id=replica.assignment_id,
                epoch=replica.epoch,
                reason=f"endpoint deleted by {endpoint.deleted_by}",
            )
            await call.kernel.event_log.append(
                command_subject(replica.worker_id), stop, event_id=f"delete-{replica.assignment_id}"
            )
    return respond(None, 204 if status == 200 else status)
