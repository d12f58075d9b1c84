"""Approval of managed and private pool enrollment tokens ("enrollment requests").

A provider that issues an enrollment token for a ``private`` or ``managed`` pool asks to put a host
into one organisation's capacity; nobody enrolls with the token until that is approved. A private pool
token is approved by an admin of its owner tenant only (the tenant's pool takes hosts with its consent
alone); a managed pool token by the operator only (a managed reservation is the operator's). Either
may refuse instead: the token is revoked, recording who. A provider key can call none of these routes,
so a provider never approves its own token.

An approval or refusal is appended with the provider's expected last sequence, so of an approval, a
refusal, the provider's revocation and an enrollment racing on one token, each is decided on the state
the others left (:func:`gateway.routes.providers.append_decided`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.api import Call, Router
from gateway.bodies import carried
from gateway.errors import conflict, forbidden, not_found
from gateway.routes.providers import Decision, append_decided, providers, token_info
from gateway.routes.tenants import iso, visible_tenant
from projections.providers import (
    APPROVED_POOLS,
    EnrollmentToken,
    ProviderRecord,
    ProvidersState,
    token_status,
)
from schemas._base import Event
from schemas.api.providers import EnrollmentRequest
from schemas.providers import EnrollmentTokenApproved, EnrollmentTokenRevoked

router = Router("enrollment")
RECENT_NS = 14 * 86_400 * 1_000_000_000
"""Listings hold the requests issued within 14 days (a token lives at most 7): the pending ones, and
those approved, refused, used or expired lately."""
_DECISION_ERRORS = {409: "the token was already used (or, to approve, revoked or expired)"}
_TENANT_DECISION: dict[str, Any] = {
    "access": "tenant",
    "role": "admin",
    "response": EnrollmentRequest,
    "errors": _DECISION_ERRORS,
}
"""The options of a tenant admin's decision routes."""
_OPERATOR_DECISION: dict[str, Any] = {
    "access": "operator",
    "response": EnrollmentRequest,
    "errors": _DECISION_ERRORS,
}
"""The options of the operator's decision routes."""


def request_body(record: ProviderRecord, token: EnrollmentToken, now_ns: int) -> EnrollmentRequest:
    return carried(
        EnrollmentRequest,
        token_info(token, now_ns),
        provider=record.provider,
        decided_at=iso(token.decided_ns) if token.decided_ns else None,
    )


def recent_requests(
    state: ProvidersState, keep: Callable[[EnrollmentToken], bool]
) -> list[EnrollmentRequest]:
    """The managed and private pool tokens issued within :data:`RECENT_NS` that ``keep`` accepts,
    oldest first."""
    now = time.time_ns()
    found = [
        (token, record)
        for record in state.providers.values()
        for token in record.tokens.values()
        if token.pool in APPROVED_POOLS and token.issued_ns > now - RECENT_NS and keep(token)
    ]
    found.sort(key=lambda pair: (pair[0].issued_ns, pair[0].token_id))
    return [request_body(record, token, now) for token, record in found]


def approval(call: Call[Any, Any], token: EnrollmentToken) -> Event | None:
    """The approval of ``token`` by the caller; ``None`` if it is approved already; 409 if it is
    used, revoked or expired."""
    status = token_status(token, time.time_ns())
    if status == "active":
        return None
    if status != "pending_approval":
        raise conflict(f"enrollment token {token.token_id} is {status}: there is nothing to approve")
    return EnrollmentTokenApproved(token_id=token.token_id, approved_by=call.principal.label)


def denial(call: Call[Any, Any], token: EnrollmentToken) -> Event | None:
    """The refusal of ``token`` by the caller (also of an approved one not used yet); ``None`` if it
    is revoked or expired already; 409 if an agent enrolled with it."""
    status = token_status(token, time.time_ns())
    if status in ("revoked", "expired"):
        return None
    if status == "used":
        raise conflict(
            f"enrollment token {token.token_id} was used by worker {token.used_by}; "
            "ask the operator to revoke that agent's credentials"
        )
    return EnrollmentTokenRevoked(token_id=token.token_id, revoked_by=call.principal.label)


async def decided(
    call: Call[Any, Any],
    find: Callable[[ProvidersState], tuple[ProviderRecord, EnrollmentToken]],
    decide: Callable[[Call[Any, Any], EnrollmentToken], Event | None],
) -> EnrollmentRequest:
    """Append ``decide``'s event about the token ``find`` names; the request as it is now."""

    def decision(state: ProvidersState) -> Decision:
        record, token = find(state)
        return record, token, decide(call, token)

    record, token, _ = await append_decided(call, decision)
    call.resource = token.token_id
    current = providers(call).providers[record.provider]
    return request_body(current, current.tokens[token.token_id], time.time_ns())


# -- a tenant's admins: private pool requests naming the tenant -------------------------------------


def tenant_token(
    tenant: str, token_id: str
) -> Callable[[ProvidersState], tuple[ProviderRecord, EnrollmentToken]]:
    """Finds the private pool token ``token_id`` naming ``tenant``; 404 for any other."""

    def find(state: ProvidersState) -> tuple[ProviderRecord, EnrollmentToken]:
        for record in state.providers.values():
            token = record.tokens.get(token_id)
            if token is not None and token.pool == "private" and token.owner_tenant == tenant:
                return record, token
        raise not_found(f"enrollment request {token_id}")

    return find


@router.get(
    "/v1/tenants/{tenant}/enrollment-requests",
    access="tenant",
    role="admin",
    response=list[EnrollmentRequest],
)
async def list_tenant_enrollment_requests(call: Call[None, None]) -> list[EnrollmentRequest]:
    """Providers' requests to put hosts into the tenant's private pool: pending and recently decided."""
    tenant = visible_tenant(call).tenant
    return recent_requests(providers(call), lambda t: t.pool == "private" and t.owner_tenant == tenant)


@router.post("/v1/tenants/{tenant}/enrollment-requests/{token_id}/approve", **_TENANT_DECISION)
async def approve_tenant_enrollment_request(call: Call[None, None]) -> EnrollmentRequest:
    """Approve a provider's host into the tenant's private pool (tenant admins only)."""
    tenant = visible_tenant(call).tenant
    if call.principal.kind != "tenant":
        raise forbidden(
            f"only an admin of tenant {tenant} approves a host into its private pool; "
            "the operator can deny the request"
        )
    return await decided(call, tenant_token(tenant, call.params["token_id"]), approval)


@router.post("/v1/tenants/{tenant}/enrollment-requests/{token_id}/deny", **_TENANT_DECISION)
async def deny_tenant_enrollment_request(call: Call[None, None]) -> EnrollmentRequest:
    """Refuse a provider's host into the tenant's private pool: the token is revoked."""
    tenant = visible_tenant(call).tenant
    return await decided(call, tenant_token(tenant, call.params["token_id"]), denial)


# -- the operator: managed and private pool requests ------------------------------------------------


def provider_token(
    provider: str, token_id: str
) -> Callable[[ProvidersState], tuple[ProviderRecord, EnrollmentToken]]:
    """Finds ``provider``'s managed or private pool token ``token_id``; 404 for any other."""

    def find(state: ProvidersState) -> tuple[ProviderRecord, EnrollmentToken]:
        record = state.providers.get(provider)
        token = record.tokens.get(token_id) if record is not None else None
        if record is None or token is None or token.pool not in APPROVED_POOLS:
            raise not_found(f"enrollment request {provider}/{token_id}")
        return record, token

    return find


@router.get("/v1/enrollment-requests", access="operator", response=list[EnrollmentRequest])
async def list_enrollment_requests(call: Call[None, None]) -> list[EnrollmentRequest]:
    """Every provider's managed and private pool requests: pending and recently decided."""
    return recent_requests(providers(call), lambda t: True)


@router.post("/v1/enrollment-requests/{provider}/{token_id}/approve", **_OPERATOR_DECISION)
async def approve_enrollment_request(call: Call[None, None]) -> EnrollmentRequest:
    """Approve a provider's host into a managed pool (a private pool's is its tenant's to approve)."""
    find = provider_token(call.params["provider"], call.params["token_id"])
    _, token = find(providers(call))
    if token.pool == "private":
        raise forbidden(
            f"a private pool host joins with its tenant's consent only: an admin of tenant "
            f"{token.owner_tenant} approves it (the operator can deny it)"
        )
    return await decided(call, find, approval)


@router.post("/v1/enrollment-requests/{provider}/{token_id}/deny", **_OPERATOR_DECISION)
async def deny_enrollment_request(call: Call[None, None]) -> EnrollmentRequest:
    """Refuse a provider's host into a managed or private pool: the token is revoked."""
    return await decided(call, provider_token(call.params["provider"], call.params["token_id"]), denial)
