"""Streams and subjects: the one table of what is stored where, and how subjects are built.

Every subject starts with its event family, and the family names the stream. Identity tokens
(tenant, job, worker ids) must be safe NATS tokens; :func:`token` checks them at the edge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from core.errors import InvalidInput
from schemas import Event

DAY_S = 86_400


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """One JetStream stream.

    Attributes:
        name: stream name.
        subjects: subjects it captures (empty for a stream that only sources another).
        family: the event family stored in it (its decoder), ``None`` for raw records.
        layout: the subject layout, for documentation and ``tail``.
        retention: ``limits`` (keep by limits) or ``workqueue`` (a message leaves once acknowledged).
        max_age_s: drop messages older than this (0: never).
        max_msgs_per_subject: keep at most this many messages per subject (-1: unlimited).
        sources: streams this one copies from (server side).
        persist_async: acknowledge before the write reaches the disk (JetStream's ``persist_mode:
            async``, R1 streams only; a replicated stream is made durable by its quorum instead).
            For heartbeats alone: each is superseded a second later, a crash loses at most the last
            moment of telemetry, and fsyncing 10,000 beats a second is what this disk cannot do.
    """

    name: str
    subjects: tuple[str, ...]
    family: str | None
    layout: str
    holds: str
    retention: Literal["limits", "workqueue"] = "limits"
    max_age_s: int = 0
    max_msgs_per_subject: int = -1
    sources: tuple[str, ...] = field(default=())
    persist_async: bool = False


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        "TENANTS",
        ("tenant.>",),
        "tenant",
        "tenant.<tenant>.<event>",
        "created, api_key_issued, api_key_revoked, quota_set",
    ),
    StreamSpec(
        "WORKERS",
        ("worker.>",),
        "worker",
        "worker.<worker_id>.<event>",
        "registered, policy_set, cordoned, uncordoned, lost, recovered, deregistered",
    ),
    StreamSpec(
        "HEARTBEATS",
        ("hb.>",),
        "hb",
        "hb.<worker_id>",
        "heartbeats with telemetry, kept 7 days",
        max_age_s=7 * DAY_S,
        persist_async=True,
    ),
    StreamSpec(
        "HEARTBEATS_LATEST",
        (),
        "hb",
        "hb.<worker_id>",
        "the latest heartbeat of every worker, kept forever (sourced from HEARTBEATS)",
        max_msgs_per_subject=1,
        sources=("HEARTBEATS",),
        persist_async=True,
    ),
    StreamSpec(
        "JOBS",
        ("job.>",),
        "job",
        "job.<tenant>.<job_id>.<event>",
        "submitted, queued, placed, assignment_revoked, rejected, started, progress, "
        "checkpointed, round_completed, completed, failed, cancelled",
    ),
    StreamSpec(
        "ENDPOINTS",
        ("endpoint.>",),
        "endpoint",
        "endpoint.<tenant>.<endpoint_id>.<event>",
        "deployed, scaled, replica_placed, replica_revoked, replica_starting, replica_ready, "
        "replica_lost, scaled_to_zero, failed, deleted",
    ),
    StreamSpec(
        "METERING",
        ("meter.>",),
        "meter",
        "meter.<tenant>.<worker_id>[.tokens]",
        "usage ticks (GPU- and CPU-milliseconds per assignment per interval; a gateway's token "
        "counts per replica on .tokens)",
    ),
    StreamSpec(
        "COMMANDS",
        ("cmd.>",),
        "cmd",
        "cmd.<worker_id>",
        "start_work, stop_work: what the kernel tells an agent (work queue)",
        retention="workqueue",
    ),
    StreamSpec(
        "PROVIDERS",
        ("provider.>",),
        "provider",
        "provider.<provider>.<event>",
        "created, api_key_issued, api_key_revoked, enrollment_token_issued, enrollment_token_revoked, "
        "agent_enrolled, agent_credentials_revoked",
    ),
    StreamSpec(
        "AUDIT",
        ("api.>",),
        "api",
        "api.<account>.<principal_kind>",
        "request: every accepted mutating API request (who, what, when)",
    ),
    StreamSpec(
        "QUARANTINE",
        ("quarantine.>",),
        None,
        "quarantine.<stream>",
        "stored messages that failed to decode, with the reason in headers",
    ),
)

BY_NAME: dict[str, StreamSpec] = {s.name: s for s in STREAMS}
DUPLICATE_WINDOW_S = 300
"""A retried append with the same event id within this window is stored once."""

_FAMILY_STREAM: dict[str, str] = {s.family: s.name for s in STREAMS if s.family and s.subjects}
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def stream_for_family(family: str) -> StreamSpec:
    """The stream that captures subjects of ``family``."""
    return BY_NAME[_FAMILY_STREAM[family]]


def stream_for_subject(subject: str) -> StreamSpec:
    """The stream that captures ``subject`` (by its first token)."""
    family = subject.split(".", 1)[0]
    if family == "quarantine":
        return BY_NAME["QUARANTINE"]
    try:
        return stream_for_family(family)
    except KeyError:
        raise InvalidInput(f"no stream captures subject {subject!r}") from None


def token(value: str, what: str = "id") -> str:
    """Check that ``value`` is safe as one subject token (letters, digits, ``-``, ``_``; 1-64 chars)."""
    if not _TOKEN.match(value):
        raise InvalidInput(f"{what} {value!r} must be 1-64 letters, digits, '-' or '_'")
    return value


def job_subject(tenant: str, job_id: str, event: type[Event] | Event) -> str:
    """``job.<tenant>.<job_id>.<event>``."""
    return f"job.{token(tenant, 'tenant')}.{token(job_id, 'job id')}.{event.event_name()}"


def job_filter(tenant: str, job_id: str) -> str:
    """Every event of one job: the filter for its expected-sequence checks."""
    return f"job.{token(tenant, 'tenant')}.{token(job_id, 'job id')}.>"


def endpoint_subject(tenant: str, endpoint_id: str, event: type[Event] | Event) -> str:
    """``endpoint.<tenant>.<endpoint_id>.<event>``."""
    return f"endpoint.{token(tenant, 'tenant')}.{token(endpoint_id, 'endpoint id')}.{event.event_name()}"


def endpoint_filter(tenant: str, endpoint_id: str) -> str:
    """Every event of one endpoint."""
    return f"endpoint.{token(tenant, 'tenant')}.{token(endpoint_id, 'endpoint id')}.>"


def worker_subject(worker_id: str, event: type[Event] | Event) -> str:
    """``worker.<worker_id>.<event>``."""
    return f"worker.{token(worker_id, 'worker id')}.{event.event_name()}"


def worker_filter(worker_id: str) -> str:
    """Every event of one worker."""
    return f"worker.{token(worker_id, 'worker id')}.>"


def heartbeat_subject(worker_id: str) -> str:
    """``hb.<worker_id>``."""
    return f"hb.{token(worker_id, 'worker id')}"


def metering_subject(tenant: str, worker_id: str) -> str:
    """``meter.<tenant>.<worker_id>``."""
    return f"meter.{token(tenant, 'tenant')}.{token(worker_id, 'worker id')}"


def token_metering_subject(tenant: str, worker_id: str) -> str:
    """``meter.<tenant>.<worker_id>.tokens``: a gateway's token counts for a replica on that worker.

    Only the kernel's services publish here (an agent may publish on ``meter.<tenant>.<its id>``
    alone, :mod:`core.natsauth`), so the ledger takes tokens from these ticks only: a provider's agent
    never counts what the tenant is billed for.
    """
    return f"{metering_subject(tenant, worker_id)}.tokens"


def command_subject(worker_id: str) -> str:
    """``cmd.<worker_id>``."""
    return f"cmd.{token(worker_id, 'worker id')}"


def command_consumer(worker_id: str) -> str:
    """``agent-<worker_id>``: the durable consumer on COMMANDS that holds one worker's commands."""
    return f"agent-{token(worker_id, 'worker id')}"


def tenant_subject(tenant: str, event: type[Event] | Event) -> str:
    """``tenant.<tenant>.<event>``."""
    return f"tenant.{token(tenant, 'tenant')}.{event.event_name()}"


def provider_subject(provider: str, event: type[Event] | Event) -> str:
    """``provider.<provider>.<event>``."""
    return f"provider.{token(provider, 'provider')}.{event.event_name()}"


def audit_subject(account: str, principal_kind: str) -> str:
    """``api.<account>.<principal_kind>``: ``account`` is a tenant or provider id, or ``_operator``."""
    return f"api.{token(account, 'account')}.{token(principal_kind, 'principal kind')}"


def quarantine_subject(stream: str) -> str:
    """``quarantine.<stream>``."""
    return f"quarantine.{stream}"
