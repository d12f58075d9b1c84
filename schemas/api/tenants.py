"""Bodies of the tenancy routes: tenants, their API keys and quotas."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.api.common import Request

TenantId = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$")]
"""Lowercase letters, digits and inner dashes, 3-40 characters: safe as a subject token and as a
bucket name."""
Role = Literal["admin", "member", "viewer"]


class CreateTenant(Request, frozen=True, kw_only=True):
    tenant: TenantId
    display_name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    plan: Literal["payg", "managed", "private"] = "payg"


class IssueKey(Request, frozen=True, kw_only=True):
    role: Role = "member"
    label: Annotated[str, msgspec.Meta(max_length=200)] = ""


class SetQuota(Request, frozen=True, kw_only=True):
    """Maximum concurrent GPUs in the pool; ``null`` removes the limit."""

    gpus: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None


class KeyInfo(msgspec.Struct, frozen=True, kw_only=True):
    key_id: str
    role: str
    label: str
    issued_at: str
    revoked: bool


class NewKey(msgspec.Struct, frozen=True, kw_only=True):
    """A freshly issued key: ``key`` is shown this once and never again."""

    key_id: str
    key: str
    role: str
    label: str


class Tenant(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    display_name: str
    bucket: str
    plan: str
    created_at: str
    quotas: dict[str, int]


class TenantCreatedBody(msgspec.Struct, frozen=True, kw_only=True):
    """A new tenant and its first admin key (shown once)."""

    tenant: Tenant
    admin_key: NewKey
