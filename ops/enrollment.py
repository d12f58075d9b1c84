"""The enrollment of an agent that runs with the kernel's own credentials, recorded as the operator.

An agent a provider runs enrolls with a one-time token through the gateway (:mod:`agent.enroll`) and
gets NATS credentials of its own. An agent the operator runs with the kernel's credentials (a cluster's
node-workers under :mod:`ops.dispatcher`, load tests, the test suite's agents) has no token to present;
:func:`enroll_kernel_agent` records its identity the same way, as the operator: without an enrollment
the intake refuses every registration.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

from agent.identity import worker_id
from core.errors import ConcurrencyConflict, EnrollmentRefused
from core.log import EventLog
from core.settings import Settings
from core.streams import provider_subject, token
from ops.process import run_async
from projections import PROVIDERS
from projections.providers import enrollment_refusal
from projections.runner import rebuild
from schemas._base import Event
from schemas.providers import AgentEnrolled, EnrollmentTokenApproved, EnrollmentTokenIssued, ProviderCreated


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
    issued = EnrollmentTokenIssued(
        token_id=token_id,
        token_sha256=secrets.token_hex(32),  # the hash of no token: nobody can present it
        expires_ns=time.time_ns(),
        pool=pool,
        region=region,
        owner_tenant=owner_tenant,
        label=f"kernel agent {worker_id}",
        issued_by=by,
    )
    events: list[Event] = [issued]
    if pool != "shared":
        events.append(EnrollmentTokenApproved(token_id=token_id, approved_by=by))
    events.append(AgentEnrolled(token_id=token_id, worker_id=worker_id))
    await event_log.append_many(
        [(provider_subject(provider, e), e, f"enroll-{worker_id}-{e.event_name()}") for e in events]
    )


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
