"""Provider accounts (operator), their API keys, agent enrollment tokens and enrolled agents
(the provider), and the agents' enrollment itself (public: the one-time token is the credential).

An enrollment token reads ``rte_<token_id>_<secret>``; only its SHA-256 is stored. Enrolling uses it
up: the ``provider.agent_enrolled`` event is appended with the provider's expected last sequence, so
of two enrollments racing with one token exactly one wins, and the other is re-decided against the
new state (the token is used: 409). The agent gets NATS credentials for its worker id alone
(:mod:`core.natsauth`); the password is in the response once and stored only as a bcrypt hash, from
which :mod:`ops.services.natsauth` renders the server's users.

A managed or private pool token enrolls nobody until approved (:mod:`gateway.routes.enrollment`);
issuing one answers the same whether or not its ``owner_tenant`` exists, so that a provider key
cannot learn which tenant ids do.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from core.errors import ConcurrencyConflict
from core.natsauth import AGENT_JS_API_PREFIX, agent_user, bcrypt_hash, inbox_prefix, new_password
from core.streams import provider_subject
from gateway.api import Call, Router
from gateway.auth import digest, new_key
from gateway.bodies import carried
from gateway.errors import ApiError, conflict, invalid, not_found
from gateway.kernel import READ_YOUR_WRITES_S
from gateway.routes.tenants import iso, key_infos
from gateway.scope import named_in_path
from projections import PROVIDERS, REGISTRY
from projections.providers import (
    EnrollmentToken,
    ProviderRecord,
    ProvidersState,
    enrolled_provider,
    enrollment_refusal,
    find_token,
    token_status,
)
from schemas._base import Event
from schemas.api.providers import (
    AgentInfo,
    CreateProvider,
    Enroll,
    Enrolled,
    EnrollmentTokenInfo,
    IssueEnrollmentToken,
    IssueProviderKey,
    NatsCredentials,
    NewEnrollmentToken,
    Provider,
    ProviderCreatedBody,
)
from schemas.api.tenants import KeyInfo, NewKey
from schemas.providers import (
    AgentCredentialsRevoked,
    AgentEnrolled,
    EnrollmentTokenIssued,
    EnrollmentTokenRevoked,
    ProviderCreated,
    ProviderKeyIssued,
    ProviderKeyRevoked,
)

router = Router("providers")
TOKEN_PREFIX = "rte_"
_TOKEN = re.compile(r"^rte_([a-z0-9]{12})_([A-Za-z0-9_-]{32,64})$")
DECIDE_ATTEMPTS = 5


def provider_body(record: ProviderRecord) -> Provider:
    now = time.time_ns()
    return carried(
        Provider,
        record,
        created_at=iso(record.created_ns),
        agents=sum(not a.revoked for a in record.agents.values()),
        active_tokens=sum(token_status(t, now) == "active" for t in record.tokens.values()),
    )


def visible_provider(call: Call[Any, Any]) -> ProviderRecord:
    """The provider named in the path, if the caller may see it (its own, or any for the operator)."""
    provider = call.params["provider"]
    principal = call.principal
    if principal.kind != "operator" and not (principal.kind == "provider" and principal.account == provider):
        raise not_found(f"provider {provider}")
    record = providers(call).providers.get(provider)
    if record is None:
        raise not_found(f"provider {provider}")
    return record


def providers(call: Call[Any, Any]) -> ProvidersState:
    state: ProvidersState = call.kernel.state(PROVIDERS)
    return state


async def append(call: Call[Any, Any], provider: str, event: Event, **options: Any) -> None:
    await call.kernel.append(provider_subject(provider, event), event, visible_in=PROVIDERS, **options)


Decision = tuple[ProviderRecord, EnrollmentToken, Event | None]
"""A decision about one enrollment token: its provider, the token as read, and the event to append
(``None``: nothing to append)."""


async def append_decided(call: Call[Any, Any], decide: Callable[[ProvidersState], Decision]) -> Decision:
    """Append the event ``decide`` returns (it reads the providers state, and raises the
    :class:`ApiError` that refuses the request) with the provider's expected last sequence; when
    something of that provider happened in between, re-read and decide again. Returns the decision
    that was appended."""
    for _ in range(DECIDE_ATTEMPTS):
        decision = record, _, event = decide(providers(call))
        if event is None:
            return decision
        try:
            await append(
                call,
                record.provider,
                event,
                expected_seq=record.last_seq,
                expected_filter=f"provider.{record.provider}.>",
            )
            return decision
        except ConcurrencyConflict:  # something happened to this provider since we read it
            last = await call.kernel.event_log.last_seq(PROVIDERS.stream)
            try:
                await call.kernel.runners[PROVIDERS.name].wait_for(last, READ_YOUR_WRITES_S)
            except TimeoutError:  # nothing of this request was stored: a retry is safe
                raise ApiError(503, "busy", "the gateway is behind the log; retry in a moment") from None
    raise ApiError(409, "busy", "the provider's account changed during every attempt; retry")


async def issue_key(call: Call[Any, Any], provider: str, label: str) -> NewKey:
    key_id, key, sha = new_key()
    await append(
        call,
        provider,
        ProviderKeyIssued(key_id=key_id, key_sha256=sha, label=label, issued_by=call.principal.label),
    )
    return NewKey(key_id=key_id, key=key, role="admin", label=label)


# -- provider accounts and keys ---------------------------------------------------------------------


@router.post(
    "/v1/providers",
    access="operator",
    body=CreateProvider,
    response=ProviderCreatedBody,
    status=201,
    errors={409: "a provider with this id exists"},
)
async def create_provider(call: Call[CreateProvider, None]) -> ProviderCreatedBody:
    """Create a provider account and issue its first API key (shown once)."""
    body = call.body
    if body.provider in providers(call).providers:
        raise conflict(f"provider {body.provider} exists")
    event = ProviderCreated(display_name=body.display_name, created_by=call.principal.label)
    try:
        await append(
            call, body.provider, event, expected_seq=0, expected_filter=f"provider.{body.provider}.>"
        )
    except ConcurrencyConflict:
        raise conflict(f"provider {body.provider} exists") from None
    key = await issue_key(call, body.provider, "first key")
    call.resource = body.provider
    return ProviderCreatedBody(provider=provider_body(providers(call).providers[body.provider]), api_key=key)


@router.get("/v1/providers", access="operator", response=list[Provider])
async def list_providers(call: Call[None, None]) -> list[Provider]:
    """Every provider account (operator only)."""
    return [provider_body(r) for r in sorted(providers(call).providers.values(), key=lambda r: r.provider)]


@router.get("/v1/providers/{provider}", access="provider", response=Provider)
async def get_provider(call: Call[None, None]) -> Provider:
    """One provider account: the caller's own (or any, for the operator)."""
    return provider_body(visible_provider(call))


@router.get("/v1/providers/{provider}/keys", access="provider", response=list[KeyInfo])
async def list_provider_keys(call: Call[None, None]) -> list[KeyInfo]:
    """The provider's API keys (ids and labels; never the keys)."""
    record = visible_provider(call)
    return key_infos(record.keys, role="admin")


@router.post(
    "/v1/providers/{provider}/keys", access="provider", body=IssueProviderKey, response=NewKey, status=201
)
async def create_provider_key(call: Call[IssueProviderKey, None]) -> NewKey:
    """Issue a provider API key; the key is in this response and never shown again."""
    record = visible_provider(call)
    key = await issue_key(call, record.provider, call.body.label)
    call.resource = key.key_id
    return key


@router.delete("/v1/providers/{provider}/keys/{key_id}", access="provider", status=204)
async def revoke_provider_key(call: Call[None, None]) -> None:
    """Revoke a provider API key: it stops working at once."""
    record = visible_provider(call)
    key = named_in_path(call, record.keys, "key_id", "key")
    if not key.revoked:
        await append(
            call, record.provider, ProviderKeyRevoked(key_id=key.key_id, revoked_by=call.principal.label)
        )


# -- enrollment tokens and agents -------------------------------------------------------------------


def token_info(token: EnrollmentToken, now_ns: int) -> EnrollmentTokenInfo:
    """The API body of an enrollment token (never the token itself)."""
    return carried(
        EnrollmentTokenInfo,
        token,
        status=token_status(token, now_ns),
        expires_at=iso(token.expires_ns),
        issued_at=iso(token.issued_ns),
    )


def check_owner(body: IssueEnrollmentToken) -> None:
    """400 unless ``owner_tenant`` is set exactly for the pools that serve one organisation.

    Whether the tenant exists is deliberately not checked: the answer would tell a provider key
    which tenant ids exist. A token naming no tenant is simply never approved.
    """
    if body.pool == "shared":
        if body.owner_tenant is not None:
            raise invalid("owner_tenant is only for managed and private pools; drop it or change the pool")
        return
    if body.owner_tenant is None:
        raise invalid(f"a {body.pool} pool worker serves one organisation: set owner_tenant")


@router.post(
    "/v1/providers/{provider}/enrollment-tokens",
    access="provider",
    body=IssueEnrollmentToken,
    response=NewEnrollmentToken,
    status=201,
)
async def create_enrollment_token(call: Call[IssueEnrollmentToken, None]) -> NewEnrollmentToken:
    """Issue a one-time agent enrollment token; the token is in this response and never shown again.

    A managed or private pool token is ``pending_approval`` until the operator (managed) or an admin
    of ``owner_tenant`` (private) approves it.
    """
    record = visible_provider(call)
    body = call.body
    check_owner(body)
    token_id = secrets.token_hex(6)
    token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    expires_ns = time.time_ns() + body.expires_in_s * 1_000_000_000
    event = carried(
        EnrollmentTokenIssued,
        body,
        token_id=token_id,
        token_sha256=digest(token),
        expires_ns=expires_ns,
        issued_by=call.principal.label,
    )
    await append(call, record.provider, event)
    call.resource = token_id
    issued = providers(call).providers[record.provider].tokens[token_id]
    return carried(NewEnrollmentToken, token_info(issued, time.time_ns()), token=token)


@router.get(
    "/v1/providers/{provider}/enrollment-tokens", access="provider", response=list[EnrollmentTokenInfo]
)
async def list_enrollment_tokens(call: Call[None, None]) -> list[EnrollmentTokenInfo]:
    """The provider's enrollment tokens and whether each is pending approval, active, used, revoked or
    expired."""
    record = visible_provider(call)
    now = time.time_ns()
    return [token_info(t, now) for t in sorted(record.tokens.values(), key=lambda t: t.issued_ns)]


@router.delete(
    "/v1/providers/{provider}/enrollment-tokens/{token_id}",
    access="provider",
    status=204,
    errors={409: "the token was already used: revoke the agent's credentials instead"},
)
async def revoke_enrollment_token(call: Call[None, None]) -> None:
    """Revoke an unused enrollment token: no agent can enroll with it any more."""
    record = visible_provider(call)
    token = named_in_path(call, record.tokens, "token_id", "enrollment token")
    if token.used_by is not None:
        raise conflict(
            f"enrollment token {token.token_id} was used by worker {token.used_by}; "
            f"revoke that agent's credentials with DELETE .../agents/{token.used_by}"
        )
    if not token.revoked:
        revoked = EnrollmentTokenRevoked(token_id=token.token_id, revoked_by=call.principal.label)
        await append(call, record.provider, revoked)


@router.get("/v1/providers/{provider}/agents", access="provider", response=list[AgentInfo])
async def list_agents(call: Call[None, None]) -> list[AgentInfo]:
    """The agents enrolled with the provider's tokens."""
    record = visible_provider(call)
    return [
        carried(AgentInfo, a, enrolled_at=iso(a.enrolled_ns))
        for a in sorted(record.agents.values(), key=lambda a: a.enrolled_ns)
    ]


@router.delete("/v1/providers/{provider}/agents/{worker_id}", access="provider", status=204)
async def revoke_agent(call: Call[None, None]) -> None:
    """Revoke an enrolled agent's NATS credentials: the server disconnects and refuses it."""
    record = visible_provider(call)
    agent = named_in_path(call, record.agents, "worker_id", "agent")
    if not agent.revoked:
        revoked = AgentCredentialsRevoked(worker_id=agent.worker_id, revoked_by=call.principal.label)
        await append(call, record.provider, revoked)


# -- enrollment -------------------------------------------------------------------------------------


def approver_of(record: ProviderRecord, token: EnrollmentToken) -> str:
    """Who must approve ``token``, and how (for the refusal of an enrollment with it)."""
    if token.pool == "private":
        return (
            f"an admin of tenant {token.owner_tenant} "
            f"(POST /v1/tenants/{token.owner_tenant}/enrollment-requests/{token.token_id}/approve)"
        )
    return f"the operator (POST /v1/enrollment-requests/{record.provider}/{token.token_id}/approve)"


def usable_token(state: ProvidersState, presented: str) -> tuple[ProviderRecord, EnrollmentToken]:
    """The provider and token ``presented`` names, if an agent may enroll with it now; else
    401/403/409."""
    match = _TOKEN.match(presented)
    if match is None:
        raise ApiError(
            401, "invalid_token", "the enrollment token is malformed: pass the whole rte_... value"
        )
    found = find_token(state, match.group(1))
    if found is None or not hmac.compare_digest(digest(presented), found[1].token_sha256):
        raise ApiError(401, "invalid_token", "unknown enrollment token: ask the provider for a new one")
    record, token = found
    if token.used_by is not None:
        raise ApiError(
            409,
            "token_used",
            f"enrollment token {token.token_id} was already used by worker {token.used_by}; "
            "each token enrolls one agent: ask the provider for a new one",
        )
    if token.revoked:
        raise ApiError(401, "token_revoked", f"enrollment token {token.token_id} was revoked")
    if token.expires_ns <= time.time_ns():
        raise ApiError(
            401,
            "token_expired",
            f"enrollment token {token.token_id} expired at {iso(token.expires_ns)}; ask for a new one",
        )
    if token.awaiting_approval:
        raise ApiError(
            403,
            "token_not_approved",
            f"enrollment token {token.token_id} puts this host in a {token.pool} pool and is not approved "
            f"yet: {approver_of(record, token)} must approve it; then enroll again",
        )
    return record, token


def check_worker(call: Call[Enroll, None], provider: str) -> None:
    """409 unless ``worker_id`` is free for ``provider``: not the kernel's own, not enrolled, not
    registered by another (:func:`projections.providers.enrollment_refusal`)."""
    worker_id = call.body.worker_id
    refusal = enrollment_refusal(providers(call), provider, worker_id, by_kernel=False)
    if refusal is not None:
        raise ApiError(409, *refusal)
    if enrolled_provider(providers(call), worker_id) is not None:
        raise ApiError(
            409,
            "worker_enrolled",
            f"worker {worker_id} is already enrolled; revoke its credentials first, "
            "or enroll from a new state dir (a new worker id)",
        )
    worker = call.kernel.state(REGISTRY).workers.get(worker_id)
    if worker is not None and worker.registration.provider != provider:
        raise ApiError(
            409, "worker_taken", f"worker id {worker_id} belongs to another host; enroll from a new state dir"
        )


@router.post(
    "/v1/agents/enroll",
    access="public",
    body=Enroll,
    response=Enrolled,
    status=201,
    errors={
        401: "malformed, unknown, revoked or expired enrollment token",
        403: "the token (a managed or private pool's) is not approved yet (token_not_approved)",
        409: "the token was already used, or the worker id is taken or the kernel's own",
    },
)
async def enroll_agent(call: Call[Enroll, None]) -> Enrolled:
    """Enroll an agent with a one-time token: NATS credentials for its worker id alone (shown once)."""
    body = call.body
    usable_token(providers(call), body.token)  # refuse bad tokens before paying for a hash
    password = new_password()
    hashed = await asyncio.to_thread(bcrypt_hash, password)

    def decide(state: ProvidersState) -> Decision:
        record, token = usable_token(state, body.token)
        check_worker(call, record.provider)
        event = AgentEnrolled(
            token_id=token.token_id,
            worker_id=body.worker_id,
            hostname=body.hostname,
            nats_user=agent_user(body.worker_id),
            nats_password_bcrypt=hashed,
        )
        return record, token, event

    record, token, _ = await append_decided(call, decide)
    call.resource = body.worker_id
    nats_url = call.kernel.gateway.agent_nats_url or call.kernel.settings.nats_url
    return carried(
        Enrolled,
        token,
        worker_id=body.worker_id,
        provider=record.provider,
        nats=NatsCredentials(
            url=nats_url,
            user=agent_user(body.worker_id),
            password=password,
            inbox_prefix=inbox_prefix(body.worker_id),
            js_api_prefix=AGENT_JS_API_PREFIX,
        ),
    )
