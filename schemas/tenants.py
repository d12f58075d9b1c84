"""Events of the TENANTS stream: ``tenant.<tenant>.<event>``."""

from __future__ import annotations

from typing import Literal

from schemas._base import Event
from schemas.values import KeyIssue, KeyRevocation

Role = Literal["admin", "member", "viewer"]


class TenantCreated(Event, tag="tenant.created", frozen=True, kw_only=True):
    """An organisation was created; its private bucket was provisioned."""

    display_name: str
    bucket: str
    plan: str = "payg"
    created_by: str = ""


class ApiKeyIssued(Event, KeyIssue, tag="tenant.api_key_issued", frozen=True, kw_only=True):
    """An API key of the tenant was issued, for one ``role`` in it."""

    role: Role
    label: str = ""
    issued_by: str = ""


class ApiKeyRevoked(Event, KeyRevocation, tag="tenant.api_key_revoked", frozen=True, kw_only=True):
    """An API key of the tenant stops working."""


class QuotaSet(Event, tag="tenant.quota_set", frozen=True, kw_only=True):
    """The tenant's GPU quota (concurrent GPUs) per pool; ``None`` removes the limit."""

    pool: str
    gpus: int | None
    set_by: str = ""


TenantEvent = TenantCreated | ApiKeyIssued | ApiKeyRevoked | QuotaSet
