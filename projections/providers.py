"""The providers projection: PROVIDERS (``provider.<provider>.<event>``) folded into provider accounts,
their API keys (hashes only), enrollment tokens (hashes only, with their approval) and enrolled agents
(with the bcrypt hash of their NATS password, from which the NATS server's agent users are rendered).

A worker's identity is fixed when it enrolls: :func:`enrollment_of` gives the provider, pool, region
and owner tenant of the token it enrolled with (and, for a managed or private pool, that somebody
entitled approved), the kernel's facts that an agent's later claims are checked against.

Worker ids are chosen by agents (``w-<hex>``) and by the kernel (the Kubernetes dispatcher's nodes),
so two parties may name the same one. Rules (:func:`enrollment_refusal`, and the fold itself):

* ids beginning with :data:`KERNEL_WORKER_PREFIX` (any case) are the kernel's: only the kernel's own
  enrollment takes one, a provider's agent never does;
* an id one provider holds live (enrolled, not revoked) is never enrolled by another: the gateway and
  the kernel refuse it, and a second provider's ``agent_enrolled`` stored anyway (two gateways racing,
  an old log) changes nothing here: the first holder keeps the id, and the second gets no agent (no
  NATS user) and no identity.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from projections.base import Projection
from schemas.envelope import Recorded
from schemas.providers import (
    AgentCredentialsRevoked,
    AgentEnrolled,
    ClusterCredentialsRevoked,
    ClusterEnrolled,
    EnrollmentTokenApproved,
    EnrollmentTokenIssued,
    EnrollmentTokenRevoked,
    ProviderCreated,
    ProviderKeyIssued,
    ProviderKeyRevoked,
    TokenTerms,
)


class ProviderKey(msgspec.Struct, frozen=True, kw_only=True):
    key_id: str
    key_sha256: str
    label: str = ""
    issued_ns: int = 0
    revoked: bool = False


KERNEL_WORKER_PREFIX = "kernel-"
"""Worker ids the kernel enrolls itself (:func:`ops.dispatcher.fleet.worker_id_for`) begin with this;
no provider's agent may enroll one."""

TokenStatus = Literal["active", "pending_approval", "used", "revoked", "expired"]
"""What :func:`token_status` says of a token."""

APPROVED_POOLS = frozenset({"managed", "private"})
"""Pools whose enrollment tokens enroll nobody until approved: a private pool's by an admin of its
owner tenant, a managed pool's by the operator."""


class EnrollmentToken(TokenTerms, frozen=True, kw_only=True):
    """A one-time token, on its terms; ``used_by`` names the worker that enrolled with it.

    Attributes:
        approved_by: who approved a managed or private pool token (``None``: not approved).
        revoked_by: who revoked it (its provider) or refused it (the approver).
        decided_ns: when it was approved or revoked (Unix ns; 0: neither).
    """

    issued_ns: int = 0
    used_by: str | None = None
    revoked: bool = False
    approved_by: str | None = None
    revoked_by: str | None = None
    decided_ns: int = 0

    @property
    def awaiting_approval(self) -> bool:
        """A managed or private pool token nobody has approved yet (whatever else its status)."""
        return self.pool in APPROVED_POOLS and self.approved_by is None


class EnrolledAgent(msgspec.Struct, frozen=True, kw_only=True):
    """An agent enrolled with one of the provider's tokens; ``revoked``: its credentials were."""

    worker_id: str
    token_id: str
    hostname: str = ""
    nats_user: str = ""
    nats_password_bcrypt: str = ""
    enrolled_ns: int = 0
    revoked: bool = False


class EnrolledCluster(msgspec.Struct, frozen=True, kw_only=True):
    """A Kubernetes cluster whose dispatcher the operator enrolled (:class:`ClusterEnrolled`);
    ``revoked``: its credentials were."""

    cluster: str
    token_id: str
    nats_user: str
    nats_password_bcrypt: str
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
    clusters: dict[str, EnrolledCluster] = {}
    last_seq: int = 0


class ProvidersState(msgspec.Struct, kw_only=True):
    """Every provider account; ``enrolled``: worker id -> the provider of its live enrollment."""

    seq: int = 0
    providers: dict[str, ProviderRecord] = {}
    enrolled: dict[str, str] = {}
    dispatchers: dict[str, str] = {}
    """:func:`dispatcher_id` of a live cluster -> its provider."""


class Enrollment(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's identity as the kernel recorded it when the worker enrolled."""

    provider: str
    worker_id: str
    token_id: str
    pool: str
    region: str
    owner_tenant: str | None


def _changed(record: ProviderRecord, event: Any, t: int) -> ProviderRecord:
    replace = msgspec.structs.replace
    match event:
        case ProviderKeyIssued(key_id=key_id, key_sha256=sha, label=label):
            key = ProviderKey(key_id=key_id, key_sha256=sha, label=label, issued_ns=t)
            return replace(record, keys={**record.keys, key_id: key})
        case ProviderKeyRevoked(key_id=key_id) if key_id in record.keys:
            return replace(record, keys={**record.keys, key_id: replace(record.keys[key_id], revoked=True)})
        case EnrollmentTokenIssued():
            issued = msgspec.convert(event, EnrollmentToken, from_attributes=True)  # the event's fields
            token = replace(issued, issued_ns=t)
            return replace(record, tokens={**record.tokens, event.token_id: token})
        case EnrollmentTokenRevoked(token_id=token_id) if token_id in record.tokens:
            token = record.tokens[token_id]
            if not token.revoked:
                token = replace(token, revoked=True, revoked_by=event.revoked_by or None, decided_ns=t)
            return replace(record, tokens={**record.tokens, token_id: token})
        case EnrollmentTokenApproved(token_id=token_id) if token_id in record.tokens:
            token = record.tokens[token_id]
            if token.awaiting_approval and not token.revoked:
                token = replace(token, approved_by=event.approved_by, decided_ns=t)
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
        case ClusterEnrolled(cluster=cluster):
            enrolled = EnrolledCluster(
                cluster=cluster,
                token_id=event.token_id,
                nats_user=event.nats_user,
                nats_password_bcrypt=event.nats_password_bcrypt,
                enrolled_ns=t,
            )
            return replace(record, clusters={**record.clusters, cluster: enrolled})
        case ClusterCredentialsRevoked(cluster=cluster) if cluster in record.clusters:
            revoked = replace(record.clusters[cluster], revoked=True)
            return replace(record, clusters={**record.clusters, cluster: revoked})
    return record


def evolve(state: ProvidersState, recorded: Recorded[Any]) -> ProvidersState:
    """Apply one PROVIDERS event; events of a provider that was never created are ignored."""
    if recorded.seq <= state.seq:
        return state
    state.seq = recorded.seq
    provider = recorded.token(1)
    event = recorded.event
    if isinstance(event, AgentEnrolled) and state.enrolled.get(event.worker_id, provider) != provider:
        return state  # another provider holds the id: first come keeps it (module docstring)
    if (
        isinstance(event, ClusterEnrolled)
        and state.dispatchers.get(dispatcher_id(event.cluster), provider) != provider
    ):
        return state  # another provider's live cluster of that name: it keeps it
    old = state.providers.get(provider)
    if isinstance(event, ProviderCreated):
        new = old or ProviderRecord(provider=provider, created_ns=recorded.time_ns)
        new = msgspec.structs.replace(new, display_name=event.display_name)
    elif old is not None:
        new = _changed(old, event, recorded.time_ns)
    else:
        return state
    state.providers[provider] = msgspec.structs.replace(new, last_seq=recorded.seq)
    match event:
        case ClusterEnrolled(cluster=cluster):
            state.dispatchers[dispatcher_id(cluster)] = provider
        case ClusterCredentialsRevoked(cluster=cluster) if (
            state.dispatchers.get(dispatcher_id(cluster)) == provider
        ):
            del state.dispatchers[dispatcher_id(cluster)]
        case AgentEnrolled(worker_id=worker_id):
            state.enrolled[worker_id] = provider
        case AgentCredentialsRevoked(worker_id=worker_id) if state.enrolled.get(worker_id) == provider:
            del state.enrolled[worker_id]
            # the kernel enrolls a worker id once, but a log may hold it live under a second provider
            other = _live_holder(state, worker_id)
            if other is not None:
                state.enrolled[worker_id] = other
    return state


def _live_holder(state: ProvidersState, worker_id: str) -> str | None:
    for record in state.providers.values():
        agent = record.agents.get(worker_id)
        if agent is not None and not agent.revoked:
            return record.provider
    return None


def is_kernel_worker_id(worker_id: str) -> bool:
    """Whether ``worker_id`` is in the kernel's namespace (:data:`KERNEL_WORKER_PREFIX`, any case)."""
    return worker_id[: len(KERNEL_WORKER_PREFIX)].lower() == KERNEL_WORKER_PREFIX


def enrollment_refusal(
    state: ProvidersState, provider: str, worker_id: str, *, by_kernel: bool
) -> tuple[str, str] | None:
    """Why ``provider`` may not enroll ``worker_id`` now, as ``(code, message)``; ``None`` if it may.

    Rules, in order: an id in the kernel's namespace is the kernel's alone (``worker_reserved``,
    unless ``by_kernel``); an id another provider holds live is refused (``worker_enrolled``; the
    holder is not named: the asker may be anyone). The same provider enrolling an id it holds again is
    the caller's to judge (the gateway refuses it, the kernel's own enrollment is idempotent).
    """
    if not by_kernel and is_kernel_worker_id(worker_id):
        return (
            "worker_reserved",
            f"worker ids beginning with {KERNEL_WORKER_PREFIX!r} are the kernel's own (its Kubernetes "
            "nodes): enroll from a new state dir (a new worker id)",
        )
    holder = state.enrolled.get(worker_id)
    if holder is not None and holder != provider:
        return (
            "worker_enrolled",
            f"worker {worker_id} is already enrolled by another provider; it keeps it until its "
            "credentials are revoked",
        )
    return None


def find_token(state: ProvidersState, token_id: str) -> tuple[ProviderRecord, EnrollmentToken] | None:
    """The provider and the enrollment token with ``token_id``, if any provider issued it."""
    for record in state.providers.values():
        token = record.tokens.get(token_id)
        if token is not None:
            return record, token
    return None


def enrolled_provider(state: ProvidersState, worker_id: str) -> str | None:
    """The provider whose live (not revoked) enrollment holds ``worker_id``, if any."""
    return state.enrolled.get(worker_id)


def dispatcher_id(cluster: str) -> str:
    """The id a cluster's dispatcher speaks under (``kernel-<cluster>``: its intake claims, its
    questions, its NATS inbox), in the kernel's namespace, where no provider's agent may be."""
    return f"{KERNEL_WORKER_PREFIX}{cluster}"


def dispatching(state: ProvidersState, sender: str) -> tuple[str, EnrolledCluster] | None:
    """``(provider, cluster)`` if ``sender`` is the :func:`dispatcher_id` of a live cluster."""
    provider = state.dispatchers.get(sender)
    if provider is None:
        return None
    record = state.providers[provider]
    for cluster in record.clusters.values():
        if dispatcher_id(cluster.cluster) == sender and not cluster.revoked:
            return provider, cluster
    return None


def cluster_nodes(state: ProvidersState, provider: str, cluster: EnrolledCluster) -> list[str]:
    """The live node-workers of ``cluster``: enrolled under its token, in its namespace, by id."""
    prefix = f"{dispatcher_id(cluster.cluster)}-"
    agents = state.providers[provider].agents.values()
    return sorted(
        a.worker_id
        for a in agents
        if a.token_id == cluster.token_id and not a.revoked and a.worker_id.startswith(prefix)
    )


def active_clusters(state: ProvidersState) -> list[tuple[str, EnrolledCluster]]:
    """Every cluster whose dispatcher's credentials are live, as ``(provider, cluster)``: the NATS
    server's dispatcher users."""
    found = [dispatching(state, sender) for sender in sorted(state.dispatchers)]
    return [f for f in found if f is not None]


def enrollment_of(state: ProvidersState, worker_id: str) -> Enrollment | None:
    """The live (not revoked) enrollment of ``worker_id``, with the pool, region and owner tenant of
    the token it enrolled with; ``None`` if it has none.

    Also ``None`` when that token is unknown, or is a managed or private pool token nobody approved
    (the gateway has refused such enrollments since approval exists; one recorded before vouches for
    nothing). O(1): the state indexes live enrollments by worker id.
    """
    provider = state.enrolled.get(worker_id)
    if provider is None:
        return None
    record = state.providers[provider]
    agent = record.agents[worker_id]
    token = record.tokens.get(agent.token_id)
    if token is None or token.awaiting_approval:
        return None
    return Enrollment(
        provider=provider,
        worker_id=worker_id,
        token_id=token.token_id,
        pool=token.pool,
        region=token.region,
        owner_tenant=token.owner_tenant,
    )


def token_status(token: EnrollmentToken, now_ns: int) -> TokenStatus:
    """``used``, ``revoked``, ``expired``, ``pending_approval`` (a managed or private pool token not
    yet approved) or ``active``, the first that applies."""
    if token.used_by is not None:
        return "used"
    if token.revoked:
        return "revoked"
    if token.expires_ns <= now_ns:
        return "expired"
    return "pending_approval" if token.awaiting_approval else "active"


def active_agents(state: ProvidersState) -> list[EnrolledAgent]:
    """Every enrolled agent whose credentials are live, by worker id: the NATS server's agent users."""
    live = [a for r in state.providers.values() for a in r.agents.values() if not a.revoked]
    return sorted(live, key=lambda a: a.worker_id)


PROVIDERS: Projection[ProvidersState] = Projection(
    name="providers", stream="PROVIDERS", version=5, state_type=ProvidersState, evolve=evolve
)
