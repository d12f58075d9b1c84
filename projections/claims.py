"""What the kernel believes of an agent: pure judgements of one claim against the kernel's own facts.

An agent says things on the INTAKE stream, under its own worker id (``intake.<worker_id>.<subject>``:
NATS lets its user publish there and nowhere else, so the sender is known). Each claim is judged
here against the schedule, the endpoint table, the registry and the enrollments; the intake service
(:mod:`ops.services.intake`) appends what is :class:`Accepted` (the kernel's own event, on the canonical
subject) and quarantines what is :class:`Refused`, with the reason and the sender. Nothing an agent
says reaches a projection any other way.

The rules, by what is claimed:

* **A report about a job or an endpoint** (started, rejected, progress, checkpointed, part stored,
  shard completed, failed; replica starting, ready, lost) names a *current* assignment of the
  sender: the tenant and work id of the subject, the slot, the epoch and the assignment id all match
  the schedule's (or the endpoint table's) current assignment, whose worker is the sender. A report
  about a finished job or a deleted endpoint is refused. A checkpoint key lies under the job's own
  checkpoint prefix, and a sharded checkpoint's part is one of the reporting node's own keys
  (:func:`projections.checkpoints.part_keys`); only the kernel names a whole set. A replica's address
  is the sender's registered host, and what that host is as an IP address (in any form an HTTP client
  reads, or the addresses its name resolved to, which the intake looks up and hands in as facts) lies
  in an allowed replica network and is never loopback (unless the deployment allows it),
  unspecified, link-local, multicast or one of the kernel's own services (:mod:`core.addresses`); its
  key (which the gateway sends in a header) is short URL-safe base64.
* **Usage** (``meter.<tenant>.<worker>.<assignment>.tick``) is accepted only for an assignment of the
  sender that is current or ended within :data:`END_GRACE_MS`, of the tenant and work it names; its
  interval lies within the assignment's life (placement to end, give or take :data:`CLOCK_SKEW_MS`)
  and not in the future, does not overlap what was already billed for the assignment, and its GPU
  (or CPU) time is at most the interval times what the assignment holds. Over-claims are refused,
  never clipped. The tick the kernel stores takes tenant, provider, pool, GPU type and tier from the
  assignment and the registry, never from the claim.
* **A registration** is refused unless the worker is enrolled, and its provider, pool, owner tenant
  and region are those of its enrollment token, and it says sandbox ``kubernetes`` (it runs work
  naming a container image) only from one of the kernel's own node-workers; its network domains
  (``topology``) name known levels with plain names; a policy only for a registered worker.
* **A node's enrollment** (``provider.<provider>.agent_enrolled``) only from the live dispatcher of a
  cluster (:func:`projections.providers.dispatching`: its sender id is ``kernel-<cluster>``, which
  NATS lets only that dispatcher's user publish under), for a worker id of that cluster's namespace
  (``kernel-<cluster>-...``) nobody holds, under the cluster's own token, with no credentials.

One module past 500 lines on purpose: it is the whole list of what the kernel believes of an agent,
each rule beside the others it must agree with (a report's tenure, its key, its address); split, a
reviewer of the trust boundary would read several files for one question.

A refusal whose reason may be the kernel's own lag (a job, an assignment, a worker or an enrollment
it does not know yet) is marked ``unknown``: the service judges it again once its projections have
caught up with their streams.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from core.addresses import ANY_NETWORK, IPAddress, IPNetwork, addresses_refusal, literal_ip
from core.errors import InvalidInput
from core.placement.rules import RUNS_IMAGES
from core.pricing import CPU_GPU_TYPE, gpu_family
from core.streams import split_intake
from projections.candidates import tier_of
from projections.checkpoints import checkpoint_prefix, part_keys
from projections.endpoints import EndpointRecord, EndpointsState, endpoint_key
from projections.endpoints import find_tenure as replica_tenure
from projections.providers import ProvidersState, dispatching, enrollment_of, is_kernel_worker_id
from projections.registry import RegistryState, WorkerRecord
from projections.schedule import TERMINAL, JobRecord, ScheduleState, job_key
from projections.schedule import find_tenure as shard_tenure
from projections.tenure import Tenure
from schemas._base import Event
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady, EndpointReplicaStarting
from schemas.jobs import (
    JobCheckpointed,
    JobCheckpointPartStored,
    JobFailed,
    JobProgress,
    JobRejected,
    JobShardCompleted,
    JobStarted,
)
from schemas.metering import UsageTick
from schemas.providers import AgentEnrolled
from schemas.values import TOPOLOGY_LEVELS, TOPOLOGY_VALUE
from schemas.workers import WorkerPolicySet, WorkerRegistered

CLOCK_SKEW_MS = 5_000
"""How far an agent's clock may be from the server's when it dates its usage."""
END_GRACE_MS = 60_000
"""How long after its assignment ended a usage interval may still end: the revocation comes first,
then the stop (SIGTERM, the checkpoint grace, SIGKILL), then the final tick."""
MAX_TEXT = 1_000
"""Longest reason or name an agent may put in a report."""
MAX_LOG_TAIL = 64 * 1024
"""Longest log tail a failure report may carry (the agent sends its last 40 lines, capped)."""
MAX_METRICS = 64
"""Most metrics one progress report may carry."""
_HOST = re.compile(r"^[A-Za-z0-9.:_-]{1,253}$")
_WORKER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # one subject token, as long as a node-worker's id may be
_TOPOLOGY = re.compile(TOPOLOGY_VALUE)
_KEY = re.compile(r"^[A-Za-z0-9._/=+-]{1,1024}$")
_API_KEY = re.compile(r"^[A-Za-z0-9_-]{0,128}$")
"""A replica's key: URL-safe base64 (what ``secrets.token_urlsafe`` makes), safe in a header."""


@dataclass(frozen=True, slots=True)
class Facts:
    """What the kernel knows when it judges a claim.

    Attributes:
        now_ns: the claim's store time on the INTAKE stream (the server's clock).
        kernel_addresses: ``host:port`` of the kernel's own services (NATS, the object store, the
            gateway): a replica may never claim to serve at one of them.
        kernel_services: the same, resolved to ``(IP address, port)``.
        replica_networks: where a replica's address must resolve (``RESONTECH_REPLICA_NETWORKS``).
        resolved: what the host names of the claims being judged resolved to (lower case name ->
            addresses; ``()`` for a name that does not resolve), looked up by the service.
    """

    schedule: ScheduleState
    endpoints: EndpointsState
    registry: RegistryState
    providers: ProvidersState
    now_ns: int
    kernel_addresses: frozenset[str] = field(default_factory=frozenset)
    kernel_services: frozenset[tuple[IPAddress, int]] = field(default_factory=frozenset)
    replica_networks: tuple[IPNetwork, ...] = ANY_NETWORK
    resolved: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Accepted:
    """The claim holds: append ``event`` (the kernel's version of it) on ``subject``."""

    subject: str
    event: Event


@dataclass(frozen=True, slots=True)
class Refused:
    """The claim does not hold, for ``reason``. ``unknown``: it names something the kernel does not
    know (yet); judge it again once the projections have caught up."""

    reason: str
    unknown: bool = False


Verdict = Accepted | Refused


def judge(
    sender: str, intake_subject: str, claim: Event, facts: Facts, *, billed_until_ms: int = 0
) -> Verdict:
    """Judge one claim stored on ``intake_subject`` (``intake.<sender>.<subject>``).

    Args:
        sender: the worker id the claim was published under.
        claim: the decoded claim (an event of the family its subject names).
        billed_until_ms: for a usage tick, where the usage already billed for its assignment ends
            (0: none yet).
    """
    try:
        worker, subject = split_intake(intake_subject)
    except InvalidInput as exc:
        return Refused(exc.message)
    if worker != sender:
        return Refused(f"claim published under {worker}, not its sender {sender}")
    tokens = subject.split(".")
    if tokens[-1] != claim.event_name() or tokens[0] != claim.event_family():
        return Refused(f"a {claim.event_tag()} claim on {subject}")
    match claim:
        case WorkerRegistered() | WorkerPolicySet():
            return _worker_claim(sender, tokens, subject, claim, facts)
        case (
            JobStarted()
            | JobRejected()
            | JobProgress()
            | JobCheckpointed()
            | JobCheckpointPartStored()
            | JobShardCompleted()
            | JobFailed()
        ):
            return _job_report(sender, tokens, subject, claim, facts)
        case EndpointReplicaStarting() | EndpointReplicaReady() | EndpointReplicaLost():
            return _replica_report(sender, tokens, subject, claim, facts)
        case UsageTick():
            return _usage(sender, tokens, subject, claim, facts, billed_until_ms)
        case AgentEnrolled():
            return _node_enrollment(sender, tokens, subject, claim, facts)
    return Refused(f"agents may not say {claim.event_tag()}")


def _node_enrollment(
    sender: str, tokens: list[str], subject: str, claim: AgentEnrolled, facts: Facts
) -> Verdict:
    """A cluster's dispatcher enrolls a new node-worker of its own cluster, under its cluster's token
    (the operator's terms: provider, pool, region, owner tenant), with no credentials of its own."""
    found = dispatching(facts.providers, sender)
    if found is None:
        return Refused(f"{sender} is no enrolled cluster's dispatcher: only one enrolls nodes", unknown=True)
    provider, cluster = found
    prefix = f"{sender}-"
    if len(tokens) != 3 or tokens[1] != provider:
        return Refused(f"the dispatcher of {cluster.cluster} enrolls nodes of provider {provider} only")
    if claim.token_id != cluster.token_id:
        return Refused(
            f"a node of {cluster.cluster} enrolls under its cluster's terms, not {claim.token_id[:80]!r}"
        )
    if not claim.worker_id.startswith(prefix) or not _WORKER.match(claim.worker_id):
        return Refused(
            f"worker {claim.worker_id[:80]!r} is not a node of cluster {cluster.cluster} ({prefix}<node>)"
        )
    if claim.nats_user or claim.nats_password_bcrypt:
        return Refused("a node-worker has no credentials of its own: its dispatcher speaks for it")
    if len(claim.hostname) > MAX_TEXT:
        return Refused("enrollment too large")
    if facts.providers.enrolled.get(claim.worker_id) is not None:
        return Refused(f"worker {claim.worker_id} is enrolled already")
    return Accepted(subject, claim)


# -- workers -------------------------------------------------------------------------------------


def _worker_claim(sender: str, tokens: list[str], subject: str, claim: Event, facts: Facts) -> Verdict:
    if len(tokens) != 3 or tokens[1] != sender:
        return Refused(f"a worker speaks only for itself: {subject}")
    if isinstance(claim, WorkerPolicySet):
        if sender not in facts.registry.workers:
            return Refused(f"worker {sender} is not registered", unknown=True)
        return Accepted(subject, claim)
    assert isinstance(claim, WorkerRegistered)
    return _registration(sender, subject, claim, facts)


def _registration(sender: str, subject: str, claim: WorkerRegistered, facts: Facts) -> Verdict:
    enrolled = enrollment_of(facts.providers, sender)
    if enrolled is None:
        return Refused(f"worker {sender} is not enrolled (or its credentials were revoked)", unknown=True)
    said: dict[str, Any] = {
        "provider": claim.provider,
        "pool": claim.pool,
        "owner_tenant": claim.owner_tenant,
        "region": claim.region,
    }
    recorded: dict[str, Any] = {
        "provider": enrolled.provider,
        "pool": enrolled.pool,
        "owner_tenant": enrolled.owner_tenant,
        "region": enrolled.region,
    }
    for name, value in said.items():
        if value != recorded[name]:
            return Refused(f"registers {name} {value!r}, but its enrollment says {recorded[name]!r}")
    if claim.sandbox == RUNS_IMAGES and not is_kernel_worker_id(sender):
        return Refused(
            f"sandbox {RUNS_IMAGES!r} is the kernel's own Kubernetes nodes' (they alone run work that "
            "names a container image); an agent runs work in its host's own environment"
        )
    if claim.address and not _HOST.match(claim.address):
        return Refused(f"address {claim.address[:80]!r} is not a host name or IP address")
    for level, name in claim.topology.items():
        if level not in TOPOLOGY_LEVELS or not _TOPOLOGY.match(name):
            return Refused(
                f"topology {level[:40]!r}: {name[:40]!r}: a level is one of {', '.join(TOPOLOGY_LEVELS)}, "
                "a name 1-128 letters, digits, '.', '_', ':' or '-'"
            )
    if (
        len(claim.hostname) > MAX_TEXT
        or len(claim.gpus) > 64
        or len(claim.labels) > 64
        or len(claim.sandbox_problem) > MAX_TEXT
    ):
        return Refused("registration too large")
    return Accepted(subject, claim)


# -- jobs ----------------------------------------------------------------------------------------


def _job_report(sender: str, tokens: list[str], subject: str, claim: Any, facts: Facts) -> Verdict:
    if len(tokens) != 4:
        return Refused(f"{subject} is not job.<tenant>.<job_id>.<event>")
    job = facts.schedule.jobs.get(job_key(tokens[1], tokens[2]))
    if job is None:
        return Refused(f"no job {tokens[1]}/{tokens[2]}", unknown=True)
    if job.state in TERMINAL:
        return Refused(f"job {job.job_id} is {job.state}")
    slot: int | None = getattr(claim, "slot", None)
    if not claim.assignment_id or (slot is None and not isinstance(claim, JobRejected)):
        return Refused(f"a {claim.event_tag()} report must name its slot and assignment")
    not_current = f"assignment {claim.assignment_id} is not a current assignment of job {job.job_id}"
    refused = _not_held(sender, claim, shard_tenure(job, claim.assignment_id), slot, not_current)
    if refused is not None:
        return refused
    match claim:
        case JobProgress(metrics=metrics) if len(metrics) > MAX_METRICS:
            return Refused(f"progress with {len(metrics)} metrics (at most {MAX_METRICS})")
        case JobCheckpointed(parts=parts) if parts:
            return Refused("only the kernel names a sharded checkpoint's set of parts")
        case JobCheckpointed(object_key=key):
            prefix = checkpoint_prefix(job)
            if not key.startswith(prefix) or not _KEY.match(key) or ".." in key.split("/"):
                return Refused(f"checkpoint {key[:200]!r} is not under the job's own {prefix}")
        case JobCheckpointPartStored(object_key=key, epoch=epoch, slot=slot, step=step):
            if key not in part_keys(job, epoch, slot):
                return Refused(f"checkpoint part {key[:200]!r} is not one of node {slot}'s own keys")
            if step < 0:
                return Refused(f"checkpoint part of step {step}")
        case JobFailed(reason=reason, log_tail=tail) if len(reason) > MAX_TEXT or len(tail) > MAX_LOG_TAIL:
            return Refused("failure report too large")
        case JobRejected(reason=reason) if len(reason) > MAX_TEXT:
            return Refused("rejection reason too long")
    return Accepted(subject, claim)


def _not_held(
    sender: str, claim: Any, held: Tenure | None, slot: int | None, not_current: str
) -> Refused | None:
    """The refusal of a report about an assignment that is not current (``held``: its tenure, if
    any), or that does not come from it; ``None`` for a report the assignment may make."""
    if held is None or held.ended_ns is not None:
        return Refused(not_current, unknown=True)
    mismatch = _mismatch(
        sender, held, slot=slot, epoch=claim.epoch, worker=getattr(claim, "worker_id", sender)
    )
    return None if mismatch is None else Refused(mismatch)


def _mismatch(sender: str, held: Tenure, *, slot: int | None, epoch: int | None, worker: str) -> str | None:
    """Why a report does not come from the assignment ``held``, or ``None``."""
    if held.worker_id != sender:
        return f"assignment {held.assignment_id} belongs to worker {held.worker_id}, not {sender}"
    if worker != sender:
        return f"worker {sender} reports as worker {worker}"
    if slot is not None and slot != held.slot:
        return f"assignment {held.assignment_id} holds slot {held.slot}, not {slot}"
    if epoch is not None and epoch != held.epoch:
        return f"assignment {held.assignment_id} is of epoch {held.epoch}, not {epoch}"
    return None


# -- endpoints -----------------------------------------------------------------------------------


def _replica_report(sender: str, tokens: list[str], subject: str, claim: Any, facts: Facts) -> Verdict:
    if len(tokens) != 4:
        return Refused(f"{subject} is not endpoint.<tenant>.<endpoint_id>.<event>")
    endpoint = facts.endpoints.endpoints.get(endpoint_key(tokens[1], tokens[2]))
    if endpoint is None:
        return Refused(f"no endpoint {tokens[1]}/{tokens[2]}", unknown=True)
    if endpoint.state == "deleted":
        return Refused(f"endpoint {endpoint.endpoint_id} is deleted")
    not_current = f"{claim.assignment_id} is not a current replica of {endpoint.endpoint_id}"
    refused = _not_held(sender, claim, replica_tenure(endpoint, claim.assignment_id), None, not_current)
    if refused is not None:
        return refused
    match claim:
        case EndpointReplicaReady(address=address, api_key=api_key):
            refusal = _address_refusal(address, facts.registry.workers.get(sender), facts)
            if refusal is None and not _API_KEY.match(api_key):
                refusal = "the replica's key is not up to 128 characters of URL-safe base64"
            if refusal is not None:
                return Refused(refusal)
        case EndpointReplicaLost(reason=reason, log_tail=tail) if (
            len(reason) > MAX_TEXT or len(tail) > MAX_LOG_TAIL
        ):
            return Refused("loss report too large")
    return Accepted(subject, claim)


def _address_refusal(address: str, worker: WorkerRecord | None, facts: Facts) -> str | None:
    """Why a replica may not claim to serve at ``address``, or ``None``: it must be
    ``http(s)://<its worker's registered host>:<port>``, none of the kernel's own services, and
    resolve where replicas may be (:func:`core.addresses.addresses_refusal`)."""
    if worker is None:
        return "the worker is not registered"
    try:
        url = urlsplit(address)
        port = url.port
    except ValueError:
        return f"address {address[:100]!r} is not a URL"
    if url.scheme not in ("http", "https") or url.hostname is None or port is None:
        return f"address {address[:100]!r} is not http(s)://host:port"
    if url.path not in ("", "/") or url.query or url.fragment or url.username or url.password:
        return f"address {address[:100]!r} has more than a scheme, host and port"
    hosts = {h.lower() for h in (worker.registration.address, worker.registration.hostname) if h}
    if url.hostname.lower() not in hosts:
        return (
            f"address {address[:100]!r} is not on the worker's registered host ({', '.join(sorted(hosts))})"
        )
    if f"{url.hostname}:{port}" in facts.kernel_addresses:
        return f"address {address[:100]!r} is one of the kernel's own services"
    refusal = addresses_refusal(
        url.hostname,
        port,
        facts.resolved.get(url.hostname.lower()),
        facts.replica_networks,
        facts.kernel_services | _literal_services(facts.kernel_addresses),
    )
    return None if refusal is None else f"address {address[:100]!r}: {refusal}"


def _literal_services(addresses: frozenset[str]) -> frozenset[tuple[IPAddress, int]]:
    """The ``host:port`` of ``addresses`` whose host is an IP address, as ``(address, port)``."""
    found = set()
    for text in addresses:
        host, _, port = text.rpartition(":")
        try:
            ip = literal_ip(host)
        except InvalidInput:
            continue
        if ip is not None and port.isdigit():
            found.add((ip, int(port)))
    return frozenset(found)


# -- usage ---------------------------------------------------------------------------------------


def _usage(
    sender: str, tokens: list[str], subject: str, tick: UsageTick, facts: Facts, billed_until_ms: int
) -> Verdict:
    if len(tokens) != 5:
        return Refused(f"{subject} is not meter.<tenant>.<worker_id>.<assignment_id>.tick")
    tenant, worker_id, assignment_id = tokens[1:4]
    if worker_id != sender or tick.assignment_id != assignment_id:
        return Refused(f"usage of {tick.assignment_id} claimed on {subject} by {sender}")
    found = _work(facts, tenant, tick)
    if isinstance(found, Refused):
        return found
    work, held, cpus = found
    if held.worker_id != sender:
        return Refused(f"assignment {assignment_id} belongs to worker {held.worker_id}, not {sender}")
    if held.epoch != tick.epoch:
        return Refused(f"assignment {assignment_id} is of epoch {held.epoch}, not {tick.epoch}")
    worker = facts.registry.workers.get(sender)
    if worker is None:
        return Refused(f"worker {sender} is not registered", unknown=True)
    refusal = _interval_refusal(tick, held, cpus, facts.now_ns // 1_000_000, billed_until_ms)
    if refusal is not None:
        return Refused(refusal)
    gpus = worker.registration.gpus
    gpu_type = gpu_family(gpus[0].model) if held.gpus and gpus else CPU_GPU_TYPE
    canonical = UsageTick(
        work_id=tick.work_id,
        work_kind=tick.work_kind,
        assignment_id=assignment_id,
        epoch=held.epoch,
        provider=worker.registration.provider,
        gpu_type=gpu_type,
        pool=work.spec.pool,
        start_ms=tick.start_ms,
        end_ms=tick.end_ms,
        gpu_ms=tick.gpu_ms,
        cpu_ms=tick.cpu_ms,
        tier=tier_of(worker, facts.now_ns),
    )
    return Accepted(subject, canonical)


def _work(
    facts: Facts, tenant: str, tick: UsageTick
) -> tuple[JobRecord | EndpointRecord, Tenure, float] | Refused:
    """The job or endpoint a tick is about, the tenure of its assignment and the CPUs it holds."""
    if tick.work_kind == "job":
        job = facts.schedule.jobs.get(job_key(tenant, tick.work_id))
        held = None if job is None else shard_tenure(job, tick.assignment_id)
        if job is None or held is None:
            return Refused(f"no assignment {tick.assignment_id} of job {tenant}/{tick.work_id}", unknown=True)
        return job, held, job.spec.resources.cpus if job.spec.resources.cpus > 0 else 1.0
    endpoint = facts.endpoints.endpoints.get(endpoint_key(tenant, tick.work_id))
    held = None if endpoint is None else replica_tenure(endpoint, tick.assignment_id)
    if endpoint is None or held is None:
        return Refused(f"no replica {tick.assignment_id} of endpoint {tenant}/{tick.work_id}", unknown=True)
    return endpoint, held, 1.0


def _interval_refusal(
    tick: UsageTick, held: Tenure, cpus: float, now_ms: int, billed_until_ms: int
) -> str | None:
    """Why the tick's interval or usage does not fit the assignment, or ``None``."""
    start, end = tick.start_ms, tick.end_ms
    if end <= start:
        return f"interval [{start}, {end}] ms is empty or reversed"
    placed_ms = held.placed_ns // 1_000_000
    if start < placed_ms - CLOCK_SKEW_MS:
        return f"interval starts at {start} ms, before the assignment was placed ({placed_ms} ms)"
    latest = now_ms if held.ended_ns is None else min(now_ms, held.ended_ns // 1_000_000 + END_GRACE_MS)
    if end > latest + CLOCK_SKEW_MS:
        what = "in the future" if held.ended_ns is None else "after the assignment ended"
        return f"interval ends at {end} ms, {what} (latest {latest} ms)"
    if start < billed_until_ms:
        return f"interval [{start}, {end}] ms overlaps usage already billed up to {billed_until_ms} ms"
    if tick.gpu_ms < 0 or tick.cpu_ms < 0:
        return "negative usage"
    span = end - start
    if held.gpus:
        if tick.cpu_ms:
            return "CPU time claimed for GPU work"
        if tick.gpu_ms > held.gpus * span:
            return f"claims {tick.gpu_ms} GPU-ms over {span} ms of an assignment holding {held.gpus} GPU(s)"
    else:
        if tick.gpu_ms:
            return "GPU time claimed for CPU work"
        if tick.cpu_ms > math.ceil(cpus * span):
            return f"claims {tick.cpu_ms} CPU-ms over {span} ms of an assignment holding {cpus:g} CPU(s)"
    return None


__all__ = ["Accepted", "Facts", "Refused", "Verdict", "judge"]
