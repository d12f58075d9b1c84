"""The providers projection: PROVIDERS (``provider.<provider>.<event>``) folded into provider accounts,
their API keys (hashes only), enrollment tokens (hashes only) and enrolled agents (with the bcrypt
hash of their NATS password, from which the NATS server's agent users are rendered)."""

from __future__ import annotations

from typing import Any

import msgspec

from projections.base import Projection
from schemas.envelope import Recorded
from schemas.providers import (
    AgentCredentialsRevoked,
    AgentEnrolled,
    EnrollmentTokenIssued,
    EnrollmentTokenRevoked,
    ProviderCreated,
    ProviderKeyIssued,
    ProviderKeyRevoked,
)


class ProviderKey(msgspec.Struct, frozen=True, kw_only=True):
    key_id: str
    key_sha256: str
    label: str = ""
    issued_ns: int = 0
    revoked: bool = False


class EnrollmentToken(msgspec.Struct, frozen=True, kw_only=True):
    """A one-time token; ``used_by`` names the worker that enrolled with it."""

    token_id: str
    token_sha256: str
    expires_ns: int
    pool: str = "shared"
    region: str = ""
    owner_tenant: str | None = None
    label: str = ""
    issued_ns: int = 0
    used_by: str | None = None
    revoked: bool = False


class EnrolledAgent(msgspec.Struct, frozen=True, kw_only=True):
    """An agent enrolled with one of the provider's tokens; ``revoked``: its credentials were."""

    worker_id: str
    token_id: str
    hostname: str = ""
    nats_user: str = ""
    nats_password_bcrypt: str = ""
    enrolled_ns: int = 0
    revoked: bool = False


class ProviderRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One provider account. ``last_seq``: PROVIDERS sequence of its latest event."""

    provider: str
    display_name: str = ""
    created_ns: int = 0
    keys: dict[str, ProviderKey] = {}
    tokens: dict[str, EnrollmentToken] = {}
    agents: dict[str, EnrolledAgent] = {}
    last_seq: int = 0


class ProvidersState(msgspec.Struct, kw_only=True):
    seq: int = 0
    providers: dict[str, ProviderRecord] = {}


def _changed(record: ProviderRecord, event: Any, t: int) -> ProviderRecord:
    replace = msgspec.structs.replace
    match event:
        case ProviderKeyIssued(key_id=key_id, key_sha256=sha, label=label):
            key = ProviderKey(key_id=key_id, key_sha256=sha, label=label, issued_ns=t)
            return replace(record, keys={**record.keys, key_id: key})
        case ProviderKeyRevoked(key_id=key_id) if key_id in record.keys:
            return replace(record, keys={**record.keys, key_id: replace(record.keys[key_id], revoked=True)})
        case EnrollmentTokenIssued():
            token = EnrollmentToken(
                token_id=event.token_id,
                token_sha256=event.token_sha256,
                expires_ns=event.expires_ns,
                pool=event.pool,
                region=event.region,
                owner_tenant=event.owner_tenant,
                label=event.label,
                issued_ns=t,
            )
            return replace(record, tokens={**record.tokens, event.token_id: token})
        case EnrollmentTokenRevoked(token_id=token_id) if token_id in record.tokens:
            token = replace(record.tokens[token_id], revoked=True)
            return replace(record, tokens={**record.tokens, token_id: token})
        case AgentEnrolled(token_id=token_id, worker_id=worker_id):
            tokens = record.tokens
            if token_id in tokens:
                tokens = {**tokens, token_id: replace(tokens[token_id], used_by=worker_id)}
            agent = EnrolledAgent(
                worker_id=worker_id,
                token_id=token_id,
                hostname=event.hostname,
                nats_user=event.nats_user,
                nats_password_bcrypt=event.nats_password_bcrypt,
                enrolled_ns=t,
            )
            return replace(record, tokens=tokens, agents={**record.agents, worker_id: agent})
        case AgentCredentialsRevoked(worker_id=worker_id) if worker_id in record.agents:
            agent = replace(record.agents[worker_id], revoked=True)
            return replace(record, agents={**record.agents, worker_id: agent})
    return record


def evolve(state: ProvidersState, recorded: Recorded[Any]) -> ProvidersState:
    """Apply one PROVIDERS event; events of a provider that was never created are ignored."""
    if recorded.seq <= state.seq:
        return state
    state.seq = recorded.seq
    provider = recorded.token(1)
    event = recorded.event
    old = state.providers.get(provider)
    if isinstance(event, ProviderCreated):
        new = old or ProviderRecord(provider=provider, created_ns=recorded.time_ns)
        new = msgspec.structs.replace(new, display_name=event.display_name)
    elif old is not None:
        new = _changed(old, event, recorded.time_ns)
    else:
        return state
    state.providers[provider] = msgspec.structs.replace(new, last_seq=recorded.seq)
    return state


def find_token(state: ProvidersState, token_id: str) -> tuple[ProviderRecord, EnrollmentToken] | None:
    """The provider and the enrollment token with ``token_id``, if any provider issued it."""
    for record in state.providers.values():
        token = record.tokens.get(token_id)
        if token is not None:
            return record, token
    return None


def enrolled_provider(state: ProvidersState, worker_id: str) -> str | None:
    """The provider whose live (not revoked) enrollment holds ``worker_id``, if any."""
    for record in state.providers.values():
        agent = record.agents.get(worker_id)
        if agent is not None and not agent.revoked:
            return record.provider
    return None


def active_agents(state: ProvidersState) -> list[EnrolledAgent]:
    """Every enrolled agent whose credentials are live, by worker id: the NATS server's agent users."""
    live = [a for r in state.providers.values() for a in r.agents.values() if not a.revoked]
    return sorted(live, key=lambda a: a.worker_id)


PROVIDERS: Projection[ProvidersState] = Projection(
    name="providers",
    stream="PROVIDERS",
    version=2,
    state_type=ProvidersState,
    initial=ProvidersState,
    evolve=evolve,
)
