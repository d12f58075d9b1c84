"""Bodies of the provider routes: provider accounts, their API keys, enrollment tokens and agents, and
the agent's enrollment itself."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.api.common import Request
from schemas.api.tenants import NewKey, TenantId

ProviderId = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$")]
"""Like a tenant id: lowercase letters, digits and inner dashes, 3-40 characters."""
WorkerId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
"""A worker id as an agent makes it (``w-<12 hex>``): letters, digits, ``-``, ``_``; 1-64."""
Label = Annotated[str, msgspec.Meta(max_length=200)]
MIN_TOKEN_TTL_S = 60
MAX_TOKEN_TTL_S = 7 * 86_400
TokenStatus = Literal["active", "pending_approval", "used", "revoked", "expired"]
"""An enrollment token's status: ``pending_approval`` until a managed or private pool token is
approved, then ``active``; ``used`` once an agent enrolled with it; ``revoked`` (by its provider, or
refused by its approver) or ``expired`` before that."""


class CreateProvider(Request, frozen=True, kw_only=True):
    provider: ProviderId
    display_name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class IssueProviderKey(Request, frozen=True, kw_only=True):
    label: Label = ""


class Provider(msgspec.Struct, frozen=True, kw_only=True):
    """A provider account, with counts of what it holds."""

    provider: str
    display_name: str
    created_at: str
    agents: int
    """Enrolled agents whose credentials are live."""
    active_tokens: int
    """Enrollment tokens an agent can enroll with now: neither used, revoked nor expired, and
    approved if their pool needs it."""


class ProviderCreatedBody(msgspec.Struct, frozen=True, kw_only=True):
    """A new provider and its first API key (shown once)."""

    provider: Provider
    api_key: NewKey


class IssueEnrollmentToken(Request, frozen=True, kw_only=True):
    """An enrollment token: one agent may enroll with it, within ``expires_in_s`` seconds.

    ``owner_tenant`` is required for ``managed`` and ``private`` pools (the organisation the
    enrolled worker serves) and refused for ``shared``. A ``managed`` or ``private`` token is issued
    ``pending_approval``: an admin of ``owner_tenant`` approves a private pool token, the operator a
    managed one. Whether ``owner_tenant`` names an existing tenant is not checked here (nor said): a
    token naming none is never approved and expires.
    """

    expires_in_s: Annotated[int, msgspec.Meta(ge=MIN_TOKEN_TTL_S, le=MAX_TOKEN_TTL_S)] = 3600
    pool: Literal["shared", "managed", "private"] = "shared"
    region: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{0,64}$")] = ""
    owner_tenant: TenantId | None = None
    label: Label = ""


class EnrollmentTokenInfo(msgspec.Struct, frozen=True, kw_only=True):
    """An enrollment token as its provider sees it (never the token itself).

    ``status``: see :data:`TokenStatus` (``used_by`` names the worker of a used one).
    ``approved_by`` / ``revoked_by``: who approved, revoked or refused it.
    """

    token_id: str
    status: TokenStatus
    expires_at: str
    issued_at: str
    pool: str
    region: str
    owner_tenant: str | None
    label: str
    used_by: str | None
    approved_by: str | None = None
    revoked_by: str | None = None


class NewEnrollmentToken(msgspec.Struct, frozen=True, kw_only=True):
    """A fresh enrollment token: ``token`` is shown this once (give it to the agent:
    ``resontech agent --enroll-token <token>``). ``status``: ``active`` for the shared pool,
    ``pending_approval`` for managed and private pools (the agent can enroll once it is approved)."""

    token_id: str
    token: str
    status: TokenStatus
    expires_at: str
    pool: str
    region: str
    owner_tenant: str | None
    label: str


class EnrollmentRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A managed or private pool enrollment token as its approver sees it (never the token itself):
    a provider asks to put a host into ``owner_tenant``'s pool. ``status`` as in
    :class:`EnrollmentTokenInfo`; ``used_by``: the worker that enrolled with it."""

    token_id: str
    provider: str
    pool: str
    region: str
    owner_tenant: str | None
    label: str
    status: TokenStatus
    issued_at: str
    expires_at: str
    approved_by: str | None
    revoked_by: str | None
    decided_at: str | None
    used_by: str | None


class AgentInfo(msgspec.Struct, frozen=True, kw_only=True):
    """An agent enrolled with one of the provider's tokens."""

    worker_id: str
    hostname: str
    token_id: str
    nats_user: str
    enrolled_at: str
    revoked: bool


class Enroll(Request, frozen=True, kw_only=True):
    """What an agent presents to enroll: the one-time token, and who it is."""

    token: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    worker_id: WorkerId
    hostname: Annotated[str, msgspec.Meta(max_length=253)] = ""


class NatsCredentials(msgspec.Struct, frozen=True, kw_only=True):
    """How the agent connects: ``RESONTECH_NATS_URL``, ``_USER``, ``_PASSWORD``, ``_INBOX_PREFIX`` and
    ``_JS_API_PREFIX``. ``password`` is shown this once."""

    url: str
    user: str
    password: str
    inbox_prefix: str
    js_api_prefix: str


class Enrolled(msgspec.Struct, frozen=True, kw_only=True):
    """An enrolled agent's identity (register with exactly these) and its NATS credentials."""

    worker_id: str
    provider: str
    pool: str
    region: str
    owner_tenant: str | None
    nats: NatsCredentials
