"""Who is calling: API keys, principals and roles.

A key reads ``rt_<key_id>_<secret>``. Only its SHA-256 is ever stored (in a ``*.api_key_issued``
event); the gateway finds the key by its id and compares digests in constant time. Three kinds of
principal:

* the **operator** (one key whose digest is configured, ``RESONTECH_GATEWAY_OPERATOR_KEY_SHA256``):
  tenants, providers, quotas, everything read-only across accounts;
* a **tenant** member with a role: ``viewer`` reads, ``member`` also submits, uploads, deploys and
  cancels, ``admin`` also manages the tenant's keys;
* a **provider** account: its own workers, their health and earnings, enrollment tokens.

Every tenant route is scoped to the caller's tenant, so another tenant's resource is simply not found.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Literal

import msgspec

from gateway.errors import ApiError, forbidden

KEY_PREFIX = "rt_"
_KEY = re.compile(r"^rt_([a-z0-9]{12})_([A-Za-z0-9_-]{32,64})$")
ROLE_RANK = {"viewer": 0, "member": 1, "admin": 2}
Kind = Literal["operator", "tenant", "provider"]
OPERATOR_KEY_ID = "operator"


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """An authenticated caller.

    Attributes:
        kind: ``operator``, ``tenant`` or ``provider``.
        account: the tenant or provider id (empty for the operator).
        role: the tenant role (``admin`` for operator and provider accounts).
        key_id: the key presented.
    """

    kind: Kind
    account: str
    role: str
    key_id: str

    @property
    def label(self) -> str:
        return "operator" if self.kind == "operator" else f"{self.kind}:{self.account}"

    def at_least(self, role: str) -> bool:
        return ROLE_RANK.get(self.role, -1) >= ROLE_RANK[role]


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateway knows of one key (from the TENANTS and PROVIDERS projections)."""

    kind: Kind
    account: str
    role: str
    key_sha256: str
    revoked: bool = False


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> tuple[str, str, str]:
    """A fresh key: ``(key_id, key, sha256)``. Show ``key`` once; store only the digest."""
    key_id = secrets.token_hex(6)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return key_id, key, digest(key)


def key_id_of(key: str) -> str | None:
    match = _KEY.match(key)
    return match.group(1) if match else None


def bearer(authorization: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header; 401 when absent or malformed."""
    if not authorization:
        raise ApiError(
            401,
            "unauthenticated",
            "send an API key as 'Authorization: Bearer rt_...'",
            {"WWW-Authenticate": "Bearer"},
        )
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "unauthenticated", "the Authorization header must read 'Bearer <key>'")
    return key.strip()


def authenticate(key: str, keys: dict[str, KeyRecord], operator_sha256: str) -> Principal:
    """The principal that ``key`` identifies; 401 for an unknown, malformed or revoked key."""
    key_sha = digest(key)
    if operator_sha256 and hmac.compare_digest(key_sha, operator_sha256):
        return Principal(kind="operator", account="", role="admin", key_id=OPERATOR_KEY_ID)
    key_id = key_id_of(key)
    record = keys.get(key_id) if key_id else None
    if record is None or not hmac.compare_digest(key_sha, record.key_sha256):
        raise ApiError(401, "unauthenticated", "unknown API key")
    if record.revoked:
        raise ApiError(401, "key_revoked", f"API key {key_id} was revoked; ask an admin for a new one")
    assert key_id is not None
    return Principal(kind=record.kind, account=record.account, role=record.role, key_id=key_id)


Access = Literal["public", "any", "operator", "tenant", "provider"]


def check_access(principal: Principal, access: Access, role: str) -> None:
    """403 unless ``principal`` may use a route open to ``access`` with at least ``role``.

    ``tenant`` routes accept the operator too (acting on a tenant named in the path or query).
    """
    if access in ("public", "any") or principal.kind == "operator":
        return
    if access == "operator":
        raise forbidden("this route is for the platform operator")
    if principal.kind != access:
        raise forbidden(f"this route is for {access} accounts, not {principal.kind} accounts")
    if access == "tenant" and not principal.at_least(role):
        raise forbidden(f"this needs the {role} role; your key has {principal.role}")


def tenant_of(principal: Principal, requested: str | None) -> str:
    """The tenant a request acts on: the caller's own; the operator must name one."""
    if principal.kind == "tenant":
        if requested and requested != principal.account:
            raise ApiError(404, "not_found", f"tenant {requested} not found")
        return principal.account
    if principal.kind == "operator":
        if not requested:
            raise ApiError(400, "tenant_required", "the operator must name the tenant (?tenant=...)")
        return requested
    raise forbidden("provider accounts cannot act on tenants")
