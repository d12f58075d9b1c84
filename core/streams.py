"""Streams and subjects: the one table of what is stored where, and how subjects are built.

Every subject starts with its event family, and the family names the stream. Identity tokens
(tenant, job, worker ids) must be safe NATS tokens; :func:`token` checks them at the edge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from core.errors import InvalidInput
from schemas._base import Event

DAY_S = 86_400
BEATS_KEPT_PER_WORKER = 7 * DAY_S
"""Heartbeats HEARTBEATS keeps of one worker (``hb.<worker_id>``): a week at one a second. Each agent
writes only its own subject, so a flood of one agent evicts only its own oldest beats."""
MAX_BEAT_BYTES = 1 << 20
"""The largest heartbeat the server stores, bytes: twice the largest one that decodes
(:class:`schemas.workers.Heartbeat`: 1,024 running ids of 512 characters, 64 GPU readings)."""
FEDERATION_HISTORY = 16
"""Messages kept per FEDERATION subject: an instance's latest beats, a job's latest claims."""


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
        max_msg_bytes: the server refuses a message larger than this (-1: the server's
            ``max_payload``).
        sources: streams this one copies from (server side).
        persist_async: acknowledge before the write reaches the disk (JetStream's ``persist_mode:
            async``, R1 streams only; a replicated stream is made durable by its quorum instead).
            For heartbeats alone: each is superseded a second later, a crash loses at most the last
            moment of telemetry, and fsyncing 10,000 beats a second is what this disk cannot do.
        atomic: the stream takes JetStream's atomic batches (``allow_atomic``), so that the kernel's
            appends share writes (:mod:`core.log.group_commit`). Off where agents write: the
            server holds at most 50 unfinished batches per stream, and a hostile agent that left
            50 open would make every other writer's batches fail for their 10 s time-out.
        named: the last token of every subject is the name of the event stored on it
            (``job.<tenant>.<job_id>.<event>``): readers quarantine an event whose type is not the
            one its subject names, and appends refuse it (:func:`subject_names`).
    """

    name: str
    subjects: tuple[str, ...]
    family: str | None
    layout: str
    holds: str
    retention: Literal["limits", "workqueue"] = "limits"
    max_age_s: int = 0
    max_msgs_per_subject: int = -1
    max_msg_bytes: int = -1
    sources: tuple[str, ...] = field(default=())
    persist_async: bool = False
    named: bool = False
    atomic: bool = True


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        "TENANTS",
        ("tenant.>",),
        "tenant",
        "tenant.<tenant>.<event>",
        "created, api_key_issued, api_key_revoked, quota_set",
        named=True,
    ),
    StreamSpec(
        "WORKERS",
        ("worker.>",),
        "worker",
        "worker.<worker_id>.<event>",
        "registered, policy_set, cordoned, uncordoned, lost, recovered, deregistered, "
        "verification_requested, verified, verification_failed",
        named=True,
    ),
    StreamSpec(
        "HEARTBEATS",
        ("hb.>",),
        "hb",
        "hb.<worker_id>",
        "heartbeats with telemetry, kept 7 days",
        max_age_s=7 * DAY_S,
        max_msgs_per_subject=BEATS_KEPT_PER_WORKER,
        max_msg_bytes=MAX_BEAT_BYTES,
        persist_async=True,
        atomic=False,
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
        atomic=False,
    ),
    StreamSpec(
        "JOBS",
        ("job.>",),
        "job",
        "job.<tenant>.<job_id>.<event>",
        "submitted, queued, placed, assignment_revoked, rejected, started, progress, "
        "checkpointed, round_completed, completed, failed, cancelled",
        named=True,
    ),
    StreamSpec(
        "FEDERATION",
        ("federation.>",),
        "federation",
        "federation.<tenant>.<job_id>.<event>; federation.<instance>.beat",
        "claimed, provisioned, released: which federation service instance runs a federated job's "
        "FL server; beat: an instance renewing its claims (each append checked against the stream's "
        "last sequence)",
        max_msgs_per_subject=FEDERATION_HISTORY,
        named=True,
    ),
    StreamSpec(
        "ENDPOINTS",
        ("endpoint.>",),
        "endpoint",
        "endpoint.<tenant>.<endpoint_id>.<event>",
        "deployed, scaled, replica_placed, replica_revoked, replica_starting, replica_ready, "
        "replica_lost, scaled_to_zero, failed, deleted",
        named=True,
    ),
    StreamSpec(
        "METERING",
        ("meter.>",),
        "meter",
        "meter.<tenant>.<worker_id>.<assignment_id>.<event>",
        "tick: GPU- and CPU-milliseconds of one assignment over one interval, as the kernel accepted "
        "them from its agent; tokens: a gateway's count of the tokens a replica served",
        named=True,
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
        named=True,
    ),
    StreamSpec(
        "AUDIT",
        ("api.>",),
        "api",
        "api.<account>.<principal_kind>",
        "request: every accepted mutating API request (who, what, when)",
    ),
    StreamSpec(
        "INTAKE",
        ("intake.>",),
        None,
        "intake.<worker_id>.<the subject the claim is for>",
        "what agents claim (reports, usage, registrations), for the intake service to check and turn "
        "into the kernel's own events (work queue)",
        retention="workqueue",
        atomic=False,
    ),
    StreamSpec(
        "QUARANTINE",
        ("quarantine.>",),
        None,
        "quarantine.<stream>",
        "stored messages that failed to decode or to match their subject, and claims the kernel "
        "refused, with the reason (and the sender of a claim) in headers",
    ),
)

BY_NAME: dict[str, StreamSpec] = {s.name: s for s in STREAMS}
DUPLICATE_WINDOW_S = 300
"""A retried append with the same event id within this window is stored once."""

_FAMILY_STREAM: dict[str, str] = {s.family: s.name for s in STREAMS if s.family and s.subjects}
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ASSIGNMENT = re.compile(r"^[A-Za-z0-9_-]{1,96}$")
_LEGACY_METER_TOKENS = 4
"""``meter.<tenant>.<worker_id>.tokens``: where gateways counted tokens before METERING had one
subject per assignment (``meter.<tenant>.<worker_id>`` held the agents' ticks). Old logs keep them;
readers still accept both shapes, for ``meter.tick`` only."""


def stream_for_family(family: str) -> StreamSpec:
    """The stream that captures subjects of ``family``."""
    return BY_NAME[_FAMILY_STREAM[family]]


def stream_for_subject(subject: str) -> StreamSpec:
    """The stream that captures ``subject`` (by its first token)."""
    family = subject.split(".", 1)[0]
    if family in ("quarantine", "intake"):
        return BY_NAME[family.upper()]
    try:
        return stream_for_family(family)
    except KeyError:
        raise InvalidInput(f"no stream captures subject {subject!r}") from None


def token(value: str, what: str = "id") -> str:
    """Check that ``value`` is safe as one subject token (letters, digits, ``-``, ``_``; 1-64 chars)."""
    if not _TOKEN.match(value):
        raise InvalidInput(f"{what} {value!r} must be 1-64 letters, digits, '-' or '_'")
    return value


def assignment_token(value: str) -> str:
    """Check an assignment id as one subject token (``<work_id>-s<slot>-e<epoch>``: up to 96 chars)."""
    if not _ASSIGNMENT.match(value):
        raise InvalidInput(f"assignment id {value!r} must be 1-96 letters, digits, '-' or '_'")
    return value


def subject_mismatch(spec: StreamSpec, subject: str, event: type[Event] | Event) -> str | None:
    """Why ``event`` may not be stored on ``subject`` of ``spec``'s stream, or ``None`` if it may.

    The event's family must be the stream's, and on a stream whose subjects end in the event name
    (``named``) the last token must be this event's name: ``job.completed`` stored on
    ``job.<t>.<j>.progress`` is refused on append and quarantined by every reader.
    """
    if spec.name == "INTAKE":  # a claim: its event must fit the subject it claims
        try:
            _, claimed = split_intake(subject)
            return subject_mismatch(stream_for_subject(claimed), claimed, event)
        except InvalidInput as exc:
            return exc.message
    family = event.event_family()
    tokens = subject.split(".")
    if tokens[0] != family or spec.family != family:
        return f"a {event.event_tag()} event does not belong on {subject}"
    if not spec.named or tokens[-1] == event.event_name():
        return None
    if family == "meter" and event.event_name() == "tick" and _legacy_meter(tokens):
        return None
    return f"subject {subject} names a {tokens[-1]} event, not {event.event_tag()}"


def _legacy_meter(tokens: list[str]) -> bool:
    return len(tokens) == 3 or (len(tokens) == _LEGACY_METER_TOKENS and tokens[-1] == "tokens")


def intake_subject(worker_id: str, subject: str) -> str:
    """``intake.<worker_id>.<subject>``: a claim by the agent of ``worker_id`` about ``subject``
    (a job, endpoint or worker event, or a usage tick), for the intake service to check."""
    return f"intake.{token(worker_id, 'worker id')}.{subject}"


def split_intake(subject: str) -> tuple[str, str]:
    """``(worker_id, claimed subject)`` of an :func:`intake_subject`.

    Raises:
        InvalidInput: ``subject`` is not ``intake.<worker_id>.<family>.<...>``.
    """
    parts = subject.split(".", 2)
    if len(parts) != 3 or parts[0] != "intake" or not _TOKEN.match(parts[1]) or "." not in parts[2]:
        raise InvalidInput(f"{subject!r} is not intake.<worker_id>.<subject>")
    return parts[1], parts[2]


def job_subject(tenant: str, job_id: str, event: type[Event] | Event) -> str:
    """``job.<tenant>.<job_id>.<event>``."""
    return f"job.{token(tenant, 'tenant')}.{token(job_id, 'job id')}.{event.event_name()}"


def job_filter(tenant: str, job_id: str) -> str:
    """Every event of one job: the filter for its expected-sequence checks."""
    return f"job.{token(tenant, 'tenant')}.{token(job_id, 'job id')}.>"


def federation_subject(tenant: str, job_id: str, event: type[Event] | Event) -> str:
    """``federation.<tenant>.<job_id>.<event>``: who runs the job's FL server (:mod:`schemas.federation`)."""
    return f"federation.{token(tenant, 'tenant')}.{token(job_id, 'job id')}.{event.event_name()}"


def federation_beat_subject(instance: str) -> str:
    """``federation.<instance>.beat``: a federation service instance's liveness."""
    return f"federation.{token(instance, 'instance')}.beat"


FEDERATION_FILTER = "federation.>"
"""Every FEDERATION subject: each append there is checked against the stream's last sequence."""


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


def metering_subject(tenant: str, worker_id: str, assignment_id: str, event: type[Event] | Event) -> str:
    """``meter.<tenant>.<worker_id>.<assignment_id>.<event>``: one subject per assignment and meter.

    ``tick`` holds the GPU and CPU time of the assignment as the kernel accepted it from the agent
    (the intake appends each with the expected last sequence of this subject, so that two intake
    instances never bill one interval twice); ``tokens`` a gateway's count of the tokens a replica
    served. Only the kernel publishes on METERING.
    """
    return (
        f"meter.{token(tenant, 'tenant')}.{token(worker_id, 'worker id')}."
        f"{assignment_token(assignment_id)}.{event.event_name()}"
    )


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
