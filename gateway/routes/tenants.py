"""Tenants (operator), their API keys (tenant admins) and GPU quotas (operator)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from core.errors import ConcurrencyConflict
from core.objects import bucket_for, provision
from core.streams import tenant_subject
from gateway import scope
from gateway.api import Call, Router
from gateway.auth import new_key
from gateway.bodies import carried
from gateway.errors import ApiError, conflict, forbidden, not_found
from projections import TENANTS
from projections.providers import ProviderKey
from projections.tenants import ApiKey, TenantRecord, TenantsState
from schemas.api.tenants import CreateTenant, IssueKey, KeyInfo, NewKey, SetQuota, Tenant, TenantCreatedBody
from schemas.tenants import ApiKeyIssued, ApiKeyRevoked, QuotaSet, Role, TenantCreated

router = Router("tenants")
POOLS = ("shared", "managed", "private")


def iso(ns: int) -> str:
    """Unix nanoseconds as ISO 8601 UTC to the second (``2026-04-01T00:00:00Z``): account times."""
    return scope.iso(ns, "seconds")


def tenant_body(record: TenantRecord) -> Tenant:
    return carried(Tenant, record, created_at=iso(record.created_ns), quotas=dict(record.quotas))


def key_infos(keys: Mapping[str, ApiKey | ProviderKey], **given: Any) -> list[KeyInfo]:
    """The API bodies of an account's keys (never the keys), oldest first; ``given``: what the
    keys do not say themselves (a provider key's role)."""
    ordered = sorted(keys.values(), key=lambda k: k.issued_ns)
    return [carried(KeyInfo, k, issued_at=iso(k.issued_ns), **given) for k in ordered]


def visible_tenant(call: Call[Any, Any], *, admin: bool = False) -> TenantRecord:
    """The tenant named in the path, if the caller may see it (its own, or any for the operator)."""
    tenant = call.params["tenant"]
    principal = call.principal
    if principal.kind != "operator" and not (principal.kind == "tenant" and principal.account == tenant):
        raise not_found(f"tenant {tenant}")
    if admin and principal.kind == "tenant" and not principal.at_least("admin"):
        raise forbidden(f"managing keys needs the admin role; your key has {principal.role}")
    state: TenantsState = call.kernel.state(TENANTS)
    record = state.tenants.get(tenant)
    if record is None:
        raise not_found(f"tenant {tenant}")
    return record


async def issue_key(call: Call[Any, Any], tenant: str, role: Role, label: str) -> NewKey:
    key_id, key, sha = new_key()
    event = ApiKeyIssued(
        key_id=key_id, key_sha256=sha, role=role, label=label, issued_by=call.principal.label
    )
    await call.kernel.append(tenant_subject(tenant, event), event, visible_in=TENANTS)
    return NewKey(key_id=key_id, key=key, role=role, label=label)


@router.post(
    "/v1/tenants",
    access="operator",
    body=CreateTenant,
    response=TenantCreatedBody,
    status=201,
    errors={409: "a tenant with this id exists"},
)
async def create_tenant(call: Call[CreateTenant, None]) -> TenantCreatedBody:
    """Create a tenant, provision its private bucket and issue its first admin key (shown once)."""
    body = call.body
    state: TenantsState = call.kernel.state(TENANTS)
    if body.tenant in state.tenants:
        raise conflict(f"tenant {body.tenant} exists")
    bucket = bucket_for(body.tenant)
    await asyncio.to_thread(provision, call.kernel.s3, bucket)
    event = TenantCreated(
        display_name=body.display_name, bucket=bucket, plan=body.plan, created_by=call.principal.label
    )
    subject = tenant_subject(body.tenant, event)
    try:
        await call.kernel.append(subject, event, expected_seq=0, visible_in=TENANTS)
    except ConcurrencyConflict:
        raise conflict(f"tenant {body.tenant} exists") from None
    key = await issue_key(call, body.tenant, "admin", "first admin key")
    call.resource = body.tenant
    record = call.kernel.state(TENANTS).tenants[body.tenant]
    return TenantCreatedBody(tenant=tenant_body(record), admin_key=key)


@router.get("/v1/tenants", access="operator", response=list[Tenant])
async def list_tenants(call: Call[None, None]) -> list[Tenant]:
    """Every tenant (operator only)."""
    state: TenantsState = call.kernel.state(TENANTS)
    return [tenant_body(r) for r in sorted(state.tenants.values(), key=lambda r: r.tenant)]


@router.get("/v1/tenants/{tenant}", access="tenant", response=Tenant)
async def get_tenant(call: Call[None, None]) -> Tenant:
    """One tenant: the caller's own (or any, for the operator)."""
    return tenant_body(visible_tenant(call))


@router.get("/v1/tenants/{tenant}/keys", access="tenant", role="admin", response=list[KeyInfo])
async def list_keys(call: Call[None, None]) -> list[KeyInfo]:
    """The tenant's API keys (ids, roles, labels; never the keys)."""
    record = visible_tenant(call, admin=True)
    return key_infos(record.keys)


@router.post(
    "/v1/tenants/{tenant}/keys", access="tenant", role="admin", body=IssueKey, response=NewKey, status=201
)
async def create_key(call: Call[IssueKey, None]) -> NewKey:
    """Issue an API key with a role; the key is in this response and never shown again."""
    record = visible_tenant(call, admin=True)
    key = await issue_key(call, record.tenant, call.body.role, call.body.label)
    call.resource = key.key_id
    return key


@router.delete("/v1/tenants/{tenant}/keys/{key_id}", access="tenant", role="admin", status=204)
async def revoke_key(call: Call[None, None]) -> None:
    """Revoke an API key: it stops working at once."""
    record = visible_tenant(call, admin=True)
    key = scope.named_in_path(call, record.keys, "key_id", "key")
    if not key.revoked:
        event = ApiKeyRevoked(key_id=key.key_id, revoked_by=call.principal.label)
        await call.kernel.append(tenant_subject(record.tenant, event), event, visible_in=TENANTS)


@router.put("/v1/tenants/{tenant}/quotas/{pool}", access="operator", body=SetQuota, response=Tenant)
async def set_quota(call: Call[SetQuota, None]) -> Tenant:
    """Set the tenant's concurrent-GPU quota in a pool (``null`` removes the limit)."""
    record = visible_tenant(call)
    pool = call.params["pool"]
    if pool not in POOLS:
        raise ApiError(400, "invalid_pool", f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
    event = QuotaSet(pool=pool, gpus=call.body.gpus, set_by=call.principal.label)
    await call.kernel.append(tenant_subject(record.tenant, event), event, visible_in=TENANTS)
    call.resource = f"{record.tenant}/{pool}"
    return tenant_body(call.kernel.state(TENANTS).tenants[record.tenant])
