"""The enrollments the operator records: an agent that runs with the kernel's own credentials, and a
Kubernetes cluster's dispatcher.

An agent a provider runs enrolls with a one-time token through the gateway (:mod:`agent.enroll`) and
gets NATS credentials of its own. An agent the operator runs with the kernel's credentials (load tests,
the test suite's agents) has no token to present;
:func:`enroll_kernel_agent` records its identity the same way, as the operator: without an enrollment
the intake refuses every registration.

A cluster's dispatcher is enrolled once per cluster (:func:`enroll_cluster`, ``resontech dispatcher
enroll``): its own NATS user, and the terms (provider, pool, region, owner tenant) every node of the
cluster then enrolls under, through the intake (:mod:`projections.claims`).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.identity import worker_id
from core.errors import ConcurrencyConflict, EnrollmentRefused
from core.log import EventLog
from core.natsauth import bcrypt_hash, dispatcher_user, new_password
from core.settings import Settings
from core.streams import provider_subject, token
from ops.process import run_async
from projections import PROVIDERS
from projections.providers import dispatcher_id, enrollment_refusal
from projections.runner import rebuild
from schemas._base import Event
from schemas.providers import (
    AgentEnrolled,
    ClusterCredentialsRevoked,
    ClusterEnrolled,
    EnrollmentTokenApproved,
    EnrollmentTokenIssued,
    ProviderCreated,
)


async def enroll_kernel_agent(
    event_log: EventLog,
    worker_id: str,
    *,
    provider: str = "local",
    pool: str = "shared",
    region: str = "",
    owner_tenant: str | None = None,
    by: str = "operator",
) -> None:
    """Record the enrollment of ``worker_id`` as the operator: the provider (created if missing), a
    token naming the pool, region and owner tenant (approved at once: the operator vouches), and the
    agent enrolled with it, without NATS credentials (it uses the kernel's). Idempotent by worker.

    Raises:
        EnrollmentRefused: another provider holds ``worker_id`` live (a provider's agent enrolled it
            first): never taken over silently (:func:`projections.providers.enrollment_refusal`;
            the fold ignores a second holder's enrollment all the same).
    """
    token(worker_id, "worker id")
    state, _ = await rebuild(event_log, PROVIDERS)
    refusal = enrollment_refusal(state, provider, worker_id, by_kernel=True)
    if refusal is not None:
        raise EnrollmentRefused(refusal[1])
    created = ProviderCreated(display_name=provider, created_by=by)
    with contextlib.suppress(ConcurrencyConflict):  # it exists
        await event_log.append(
            provider_subject(provider, created),
            created,
            expected_seq=0,
            expected_filter=f"provider.{provider}.>",
        )
    token_id = f"k{secrets.token_hex(6)}"
    events = _terms(token_id, f"kernel agent {worker_id}", by, pool, region, owner_tenant)
    events.append(AgentEnrolled(token_id=token_id, worker_id=worker_id))
    await event_log.append_many(
        [(provider_subject(provider, e), e, f"enroll-{worker_id}-{e.event_name()}") for e in events]
    )


CLUSTER_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,22}[a-z0-9])?$")
"""A cluster's name: a DNS label of at most 24 characters, so that ``kernel-<cluster>-`` always
begins its nodes' ids (:func:`ops.dispatcher.fleet.worker_id_for` keeps the first 51 characters)."""


@dataclass(frozen=True, slots=True)
class ClusterEnrollment:
    """What :func:`enroll_cluster` recorded: the token its nodes enroll under, and the dispatcher's
    NATS password (``None`` when the cluster was already enrolled live and ``rotate`` was not asked)."""

    token_id: str
    password: str | None


async def enroll_cluster(
    event_log: EventLog,
    cluster: str,
    *,
    provider: str,
    pool: str = "shared",
    region: str = "",
    owner_tenant: str | None = None,
    by: str = "operator",
    rotate: bool = True,
) -> ClusterEnrollment:
    """Record the enrollment of ``cluster``'s dispatcher as the operator: the provider (created if
    missing), the terms its nodes enroll under (a token nobody can present, approved at once: the
    operator vouches), and the dispatcher's NATS user with a fresh password. A cluster keeps its
    terms: enrolling it again (with ``rotate``) only replaces the password.

    Raises:
        EnrollmentRefused: the name is not a cluster name, another provider holds the cluster, or
            the terms differ from those its nodes enrolled under.
    """
    if not CLUSTER_NAME.match(cluster):
        raise EnrollmentRefused(f"cluster name {cluster[:80]!r} is not a DNS label of at most 24 characters")
    token(provider, "provider")
    state, _ = await rebuild(event_log, PROVIDERS)
    holder = state.dispatchers.get(dispatcher_id(cluster))
    if holder is not None and holder != provider:
        raise EnrollmentRefused(f"cluster {cluster} is enrolled by another provider")
    record = state.providers.get(provider)
    known = record.clusters.get(cluster) if record is not None else None
    terms = {"pool": pool, "region": region, "owner_tenant": owner_tenant}
    if known is not None:
        held = record.tokens[known.token_id] if record is not None else None
        said = (
            {"pool": held.pool, "region": held.region, "owner_tenant": held.owner_tenant} if held else terms
        )
        if said != terms:
            raise EnrollmentRefused(f"cluster {cluster}'s nodes are enrolled as {said}, not {terms}")
        if not rotate and not known.revoked:
            return ClusterEnrollment(token_id=known.token_id, password=None)
    events: list[Event] = (
        [] if record is not None else [ProviderCreated(display_name=provider, created_by=by)]
    )
    if known is None:
        token_id = f"c{secrets.token_hex(6)}"
        events += _terms(token_id, f"the nodes of cluster {cluster}", by, pool, region, owner_tenant)
    else:
        token_id = known.token_id
    password = new_password()
    events.append(
        ClusterEnrolled(
            cluster=cluster,
            token_id=token_id,
            nats_user=dispatcher_user(cluster),
            nats_password_bcrypt=bcrypt_hash(password),
            enrolled_by=by,
        )
    )
    await event_log.append_many([(provider_subject(provider, e), e) for e in events])
    return ClusterEnrollment(token_id=token_id, password=password)


def _terms(
    token_id: str, label: str, by: str, pool: str, region: str, owner_tenant: str | None
) -> list[Event]:
    """A token nobody can present (its hash is of no token) naming the terms, approved at once unless
    shared: the operator vouches for them."""
    issued = EnrollmentTokenIssued(
        token_id=token_id,
        token_sha256=secrets.token_hex(32),
        expires_ns=time.time_ns(),
        pool=pool,
        region=region,
        owner_tenant=owner_tenant,
        label=label,
        issued_by=by,
    )
    approved = EnrollmentTokenApproved(token_id=token_id, approved_by=by)
    return [issued] if pool == "shared" else [issued, approved]


async def revoke_cluster(event_log: EventLog, cluster: str, *, by: str = "operator") -> bool:
    """Revoke the credentials of ``cluster``'s dispatcher; whether it was live."""
    state, _ = await rebuild(event_log, PROVIDERS)
    provider = state.dispatchers.get(dispatcher_id(cluster))
    if provider is None:
        return False
    revoked = ClusterCredentialsRevoked(cluster=cluster, revoked_by=by)
    await event_log.append(provider_subject(provider, revoked), revoked)
    return True


def enroll_state_dir(settings: Settings, state_dir: Path, **identity: Any) -> str:
    """Create (or read) the worker id of an agent state dir and record its enrollment as the operator
    (:func:`enroll_kernel_agent`), before the agent's first start; returns the worker id. Blocking:
    for the code that starts kernel-run agents (load tests, the test suite)."""
    worker = worker_id(state_dir)

    async def enroll() -> None:
        async with await EventLog.connect(settings, name="enroll") as event_log:
            await enroll_kernel_agent(event_log, worker, **identity)

    run_async(enroll)
    return worker
