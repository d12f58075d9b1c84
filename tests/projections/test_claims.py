"""The intake's rules as pure functions (:mod:`projections.claims`, :mod:`projections.probation`):
what the kernel believes of an agent's claim, judged against states folded from real events. The same
attacks with real credentials and a real server are in :mod:`tests.e2e.trust.test_claims`."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from core.streams import endpoint_subject, intake_subject, job_subject, metering_subject, worker_subject
from projections import ENDPOINTS, PROVIDERS, REGISTRY, SCHEDULE
from projections.claims import END_GRACE_MS, Accepted, Facts, Refused, judge
from projections.probation import RETRY_AFTER_S, due
from projections.providers import dispatching
from projections.tenure import RETIRED_KEEP_NS
from schemas._base import Event
from schemas.endpoints import EndpointDeployed, EndpointReplicaPlaced, EndpointReplicaReady
from schemas.envelope import Recorded
from schemas.jobs import (
    JobAssignmentRevoked,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobProgress,
    JobRejected,
    JobResources,
    JobShardCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.metering import UsageTick
from schemas.providers import (
    AgentEnrolled,
    ClusterCredentialsRevoked,
    ClusterEnrolled,
    EnrollmentTokenIssued,
    ProviderCreated,
)
from schemas.values import Assignment, Gpu, Provenance
from schemas.workers import (
    WorkerRegistered,
    WorkerVerificationFailed,
    WorkerVerificationRequested,
    WorkerVerified,
)

S = 1_000_000_000
T0 = 1_790_000_000 * S
ME, OTHER = "w-mallory", "w-honest"


def fold(projection: Any, events: list[tuple[str, Event, int]]) -> Any:
    """``projection`` folded over ``(subject, event, time_ns)`` records."""
    records = [
        Recorded(stream=projection.stream, seq=n, subject=subject, time_ns=t, msg_id=f"m{n}", event=event)
        for n, (subject, event, t) in enumerate(events, start=1)
    ]
    return projection.fold(records)


def registered(*workers: str, gpus: int = 0) -> list[tuple[str, Event, int]]:
    gpu = [Gpu(index=0, model="NVIDIA A100-SXM4-80GB", vram_total_mb=81920, vram_free_mb=81920)] * gpus
    out: list[tuple[str, Event, int]] = []
    for w in workers:
        e = WorkerRegistered(provider="gpuco", hostname=f"{w}.example", address="10.0.0.7", gpus=gpu)
        out.append((worker_subject(w, e), e, T0))
    return out


def job_events(*, placed_on: str = OTHER, gpus: int = 0, cpus: float = 1.0) -> list[tuple[str, Event, int]]:
    submitted = JobSubmitted(
        name="train", kind="process", shards=2, resources=JobResources(gpus=gpus, cpus=cpus)
    )
    a = Assignment(assignment_id="j1-s0-e1", worker_id=placed_on, slot=0, epoch=1, gpus=gpus)
    placed = JobPlaced(assignments=[a], provenance=Provenance(candidates=1))
    return [
        (job_subject("victim", "j1", submitted), submitted, T0),
        (job_subject("victim", "j1", placed), placed, T0 + 10 * S),
    ]


def facts(
    jobs: list[tuple[str, Event, int]] | None = None,
    endpoints: list[tuple[str, Event, int]] | None = None,
    workers: list[tuple[str, Event, int]] | None = None,
    now_ns: int = T0 + 60 * S,
    enrolled: dict[str, dict[str, Any]] | None = None,
) -> Facts:
    if jobs is None:
        jobs = []
    provider_events: list[tuple[str, Event, int]] = [
        ("provider.gpuco.created", ProviderCreated(display_name="GPU Co"), T0)
    ]
    for n, (worker, token) in enumerate((enrolled or {}).items()):
        issued = EnrollmentTokenIssued(token_id=f"t{n}", token_sha256="x", expires_ns=T0 * 2, **token)
        provider_events += [
            ("provider.gpuco.enrollment_token_issued", issued, T0),
            ("provider.gpuco.agent_enrolled", AgentEnrolled(token_id=f"t{n}", worker_id=worker), T0),
        ]
    return Facts(
        schedule=fold(SCHEDULE, jobs),
        endpoints=fold(ENDPOINTS, endpoints or []),
        registry=fold(REGISTRY, registered(ME, OTHER) if workers is None else workers),
        providers=fold(PROVIDERS, provider_events),
        now_ns=now_ns,
        kernel_addresses=frozenset({"10.0.0.7:4222"}),
        resolved={"w-mallory.example": ("10.0.0.7",)},  # what the intake looked up
    )


def claim(subject: str, event: Event, facts: Facts, sender: str = ME, **kw: Any) -> Any:
    return judge(sender, intake_subject(sender, subject), event, facts, **kw)


def reason(verdict: Any) -> str:
    assert isinstance(verdict, Refused), verdict
    return verdict.reason


# -- reports -------------------------------------------------------------------------------------


def test_a_report_names_a_current_assignment_of_its_sender() -> None:
    mine, theirs = facts(job_events(placed_on=ME)), facts(job_events())
    started = JobStarted(assignment_id="j1-s0-e1", worker_id=ME, slot=0, epoch=1)
    on = job_subject("victim", "j1", started)
    assert claim(on, started, mine) == Accepted(on, started)
    assert "belongs to worker w-honest, not w-mallory" in reason(claim(on, started, theirs))
    as_other = JobStarted(assignment_id="j1-s0-e1", worker_id=OTHER, slot=0, epoch=1)
    assert "reports as worker w-honest" in reason(claim(on, as_other, mine))
    other_slot = JobStarted(assignment_id="j1-s0-e1", worker_id=ME, slot=1, epoch=1)
    assert "holds slot 0, not 1" in reason(claim(on, other_slot, mine))
    stale = JobStarted(assignment_id="j1-s0-e1", worker_id=ME, slot=0, epoch=2)
    assert "is of epoch 1, not 2" in reason(claim(on, stale, mine))
    unknown = claim(job_subject("victim", "j2", started), started, mine)
    assert isinstance(unknown, Refused) and unknown.unknown  # judged again once caught up
    elsewhere = claim(job_subject("bystander", "j1", started), started, mine)
    assert "no job bystander/j1" in reason(elsewhere)


def test_every_kind_of_job_report_is_bound_to_its_assignment() -> None:
    mine, theirs = facts(job_events(placed_on=ME)), facts(job_events())
    reports: list[Event] = [
        JobFailed(reason="oom", epoch=1, slot=0, assignment_id="j1-s0-e1"),
        JobShardCompleted(assignment_id="j1-s0-e1", worker_id=ME, slot=0, epoch=1),
        JobRejected(assignment_id="j1-s0-e1", worker_id=ME, epoch=1, reason="policy"),
        JobProgress(epoch=1, slot=0, assignment_id="j1-s0-e1", loss=0.5),
        JobCheckpointed(
            epoch=1, slot=0, assignment_id="j1-s0-e1", object_key="jobs/train/checkpoints/j1/e1-0.ckpt"
        ),
    ]
    for report in reports:
        on = job_subject("victim", "j1", report)
        assert isinstance(claim(on, report, mine), Accepted), report
        assert "belongs to worker w-honest" in reason(claim(on, report, theirs)), report
    # what only the kernel says, or a job-wide failure, is never an agent's
    assert "agents may not say job.completed" in reason(
        claim(job_subject("victim", "j1", JobCompleted), JobCompleted(), mine)
    )
    assert "must name its slot and assignment" in reason(
        claim(job_subject("victim", "j1", JobFailed), JobFailed(reason="x"), mine)
    )


def test_a_claim_of_one_type_on_another_types_subject_is_refused() -> None:
    mine = facts(job_events(placed_on=ME))
    assert "a job.completed claim on job.victim.j1.progress" in reason(
        claim(job_subject("victim", "j1", JobProgress), JobCompleted(), mine)
    )
    assert "not its sender" in reason(
        judge(ME, intake_subject(OTHER, "job.victim.j1.progress"), JobProgress(epoch=1), mine)
    )


def test_reports_about_a_finished_job_and_stale_assignments_are_refused() -> None:
    completed = (job_subject("victim", "j1", JobCompleted), JobCompleted(), T0 + 20 * S)
    done = [*job_events(placed_on=ME), completed]
    progress = JobProgress(epoch=1, slot=0, assignment_id="j1-s0-e1")
    assert "job j1 is completed" in reason(
        claim(job_subject("victim", "j1", progress), progress, facts(done))
    )
    revoked = JobAssignmentRevoked(assignment_id="j1-s0-e1", worker_id=ME, slot=0, epoch=1, reason="lost")
    gone = [*job_events(placed_on=ME), (job_subject("victim", "j1", revoked), revoked, T0 + 20 * S)]
    assert "is not a current assignment" in reason(
        claim(job_subject("victim", "j1", progress), progress, facts(gone))
    )


@pytest.mark.parametrize(
    "key",
    [
        "datasets/secret.csv",
        "jobs/train/checkpoints/j2/e1-0.ckpt",  # another job of the same name
        "jobs/train/checkpoints/j1/../../../datasets/secret.csv",
        "jobs/train/checkpoints/j1/x\nmore",
    ],
)
def test_a_checkpoint_lies_under_the_jobs_own_prefix(key: str) -> None:
    event = JobCheckpointed(epoch=1, slot=0, assignment_id="j1-s0-e1", object_key=key)
    assert "is not under the job's own jobs/train/checkpoints/j1/" in reason(
        claim(job_subject("victim", "j1", event), event, facts(job_events(placed_on=ME)))
    )


def test_progress_carries_at_most_64_metrics() -> None:
    event = JobProgress(epoch=1, slot=0, assignment_id="j1-s0-e1", metrics={f"m{i}": 1.0 for i in range(65)})
    assert "65 metrics" in reason(
        claim(job_subject("victim", "j1", event), event, facts(job_events(placed_on=ME)))
    )


# -- replicas ------------------------------------------------------------------------------------


def replica_on(worker: str) -> list[tuple[str, Event, int]]:
    deployed = EndpointDeployed(name="chat", model="m")
    a = Assignment(assignment_id="e1-s0-e1", worker_id=worker, slot=0, epoch=1)
    placed = EndpointReplicaPlaced(assignments=[a], provenance=Provenance(candidates=1))
    return [
        (endpoint_subject("victim", "e1", deployed), deployed, T0),
        (endpoint_subject("victim", "e1", placed), placed, T0),
    ]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("http://10.0.0.7:8000", None),
        ("https://w-mallory.example:8443", None),  # its registered host name
        ("http://10.0.0.8:8000", "is not on the worker's registered host"),
        ("http://169.254.169.254:80", "is not on the worker's registered host"),
        ("http://10.0.0.7:4222", "is one of the kernel's own services"),
        ("http://10.0.0.7:8000/v1/admin", "has more than a scheme, host and port"),
        ("http://user:pw@10.0.0.7:8000", "has more than a scheme, host and port"),
        ("ftp://10.0.0.7:21", "is not http(s)://host:port"),
        ("http://10.0.0.7", "is not http(s)://host:port"),
        ("http://10.0.0.7:99999", "is not a URL"),
    ],
)
def test_a_replica_serves_on_its_workers_registered_host_only(address: str, why: str | None) -> None:
    ready = EndpointReplicaReady(assignment_id="e1-s0-e1", epoch=1, address=address)
    verdict = claim(endpoint_subject("victim", "e1", ready), ready, facts(endpoints=replica_on(ME)))
    if why is None:
        assert isinstance(verdict, Accepted)
    else:
        assert why in reason(verdict)
    assert "belongs to worker" in reason(
        claim(endpoint_subject("victim", "e1", ready), ready, facts(endpoints=replica_on(OTHER)))
    )


@pytest.mark.parametrize(
    ("api_key", "accepted"),
    [
        ("", True),  # an older agent's replica takes no key
        ("Zm9v_YmFy-" * 4 + "abc", True),  # what secrets.token_urlsafe(32) makes
        ("k\r\nx-forwarded-for: 1.2.3.4", False),  # would be a second header
        ("k" * 129, False),
        ("key with spaces", False),
    ],
)
def test_a_replicas_key_is_short_url_safe_base64(api_key: str, accepted: bool) -> None:
    ready = EndpointReplicaReady(
        assignment_id="e1-s0-e1", epoch=1, address="http://10.0.0.7:8000", api_key=api_key
    )
    verdict = claim(endpoint_subject("victim", "e1", ready), ready, facts(endpoints=replica_on(ME)))
    if accepted:
        assert isinstance(verdict, Accepted) and verdict.event == ready
    else:
        assert "key is not" in reason(verdict)


# -- usage ---------------------------------------------------------------------------------------

PLACED_MS = (T0 + 10 * S) // 1_000_000


def usage(
    start: int, end: int, *, tenant: str = "victim", worker: str = ME, **kw: Any
) -> tuple[str, UsageTick]:
    tick = UsageTick(
        work_id="j1",
        work_kind="job",
        assignment_id="j1-s0-e1",
        epoch=1,
        start_ms=start,
        end_ms=end,
        provider="anyone",
        gpu_type="H100",
        pool="managed",
        tier="platinum",
        **kw,
    )
    return metering_subject(tenant, worker, "j1-s0-e1", UsageTick), tick


def test_an_honest_tick_is_stored_with_the_kernels_facts() -> None:
    subject, tick = usage(PLACED_MS + 100, PLACED_MS + 10_100, cpu_ms=20_000)
    verdict = claim(subject, tick, facts(job_events(placed_on=ME, cpus=2.0)))
    assert isinstance(verdict, Accepted) and verdict.subject == subject
    stored = verdict.event
    assert isinstance(stored, UsageTick)
    assert (stored.provider, stored.gpu_type, stored.pool, stored.tier) == (
        "gpuco",
        "cpu",
        "shared",
        "unverified",
    )
    assert (stored.start_ms, stored.end_ms, stored.cpu_ms, stored.gpu_ms) == (
        tick.start_ms,
        tick.end_ms,
        20_000,
        0,
    )


def test_a_gpu_tick_is_billed_at_the_workers_gpu_family() -> None:
    workers = registered(ME, OTHER, gpus=1)
    subject, tick = usage(PLACED_MS, PLACED_MS + 1_000, gpu_ms=1_000)
    verdict = claim(subject, tick, facts(job_events(placed_on=ME, gpus=1), workers=workers))
    assert isinstance(verdict, Accepted) and verdict.event.gpu_type == "A100"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("start", "end", "usage_ms", "why"),
    [
        (PLACED_MS, PLACED_MS + 1, {"cpu_ms": 3_600_000_000}, "claims 3600000000 CPU-ms over 1 ms"),
        (PLACED_MS, PLACED_MS + 1_000, {"cpu_ms": 1_001}, "claims 1001 CPU-ms over 1000 ms"),
        (PLACED_MS, PLACED_MS + 1_000, {"gpu_ms": 1}, "GPU time claimed for CPU work"),
        (PLACED_MS, PLACED_MS + 1_000, {"cpu_ms": -1}, "negative usage"),
        (PLACED_MS + 500, PLACED_MS, {}, "empty or reversed"),
        (PLACED_MS - 60_000, PLACED_MS - 59_000, {}, "before the assignment was placed"),
        (PLACED_MS + 3_600_000, PLACED_MS + 3_601_000, {}, "in the future"),
    ],
)
def test_over_claims_are_refused_not_clipped(
    start: int, end: int, usage_ms: dict[str, int], why: str
) -> None:
    subject, tick = usage(start, end, **usage_ms)
    assert why in reason(claim(subject, tick, facts(job_events(placed_on=ME))))


def test_usage_overlapping_what_was_billed_is_refused() -> None:
    subject, tick = usage(PLACED_MS + 500, PLACED_MS + 1_500, cpu_ms=1_000)
    mine = facts(job_events(placed_on=ME))
    assert "overlaps usage already billed up to" in reason(
        claim(subject, tick, mine, billed_until_ms=PLACED_MS + 1_000)
    )
    assert isinstance(claim(subject, tick, mine, billed_until_ms=PLACED_MS + 500), Accepted)  # contiguous


def test_usage_of_another_workers_or_tenants_assignment_is_refused() -> None:
    subject, tick = usage(PLACED_MS, PLACED_MS + 1_000, cpu_ms=1_000)
    assert "belongs to worker w-honest" in reason(claim(subject, tick, facts(job_events(placed_on=OTHER))))
    subject, tick = usage(PLACED_MS, PLACED_MS + 1_000, tenant="bystander", cpu_ms=1_000)
    assert "no assignment j1-s0-e1 of job bystander/j1" in reason(
        claim(subject, tick, facts(job_events(placed_on=ME)))
    )
    subject, tick = usage(PLACED_MS, PLACED_MS + 1_000, worker=OTHER, cpu_ms=1_000)
    assert "claimed on" in reason(claim(subject, tick, facts(job_events(placed_on=ME))))


def test_the_last_ticks_of_an_ended_assignment_are_accepted_within_the_grace() -> None:
    revoked = JobAssignmentRevoked(
        assignment_id="j1-s0-e1", worker_id=ME, slot=0, epoch=1, reason="preempted"
    )
    ended_ns = T0 + 30 * S
    events = [*job_events(placed_on=ME), (job_subject("victim", "j1", revoked), revoked, ended_ns)]
    now = ended_ns + 120 * S
    ended_ms = ended_ns // 1_000_000
    subject, last = usage(ended_ms - 5_000, ended_ms + END_GRACE_MS - 1_000, cpu_ms=10)
    assert isinstance(claim(subject, last, facts(events, now_ns=now)), Accepted)  # the stop's grace
    subject, late = usage(ended_ms, ended_ms + END_GRACE_MS + 60_000, cpu_ms=10)
    assert "after the assignment ended" in reason(claim(subject, late, facts(events, now_ns=now)))
    much_later = ended_ns + RETIRED_KEEP_NS + S  # the tenure is forgotten at the job's next event
    forgotten = [*events, (job_subject("victim", "j1", JobProgress), JobProgress(epoch=1), much_later)]
    assert reason(claim(subject, last, facts(forgotten, now_ns=much_later)))


# -- registrations and verification --------------------------------------------------------------


def test_a_registration_says_what_its_enrollment_says() -> None:
    enrolled = {ME: {"pool": "shared", "region": "eu-north"}}
    honest = WorkerRegistered(provider="gpuco", hostname="h", region="eu-north")
    on = worker_subject(ME, honest)
    assert isinstance(claim(on, honest, facts(enrolled=enrolled)), Accepted)
    racked = msgspec.structs.replace(honest, topology={"rack": "r12", "clique": "6c1f.1"})
    assert isinstance(claim(on, racked, facts(enrolled=enrolled)), Accepted)
    for lie, why in (
        (
            {"pool": "private", "owner_tenant": "victim"},
            "registers pool 'private', but its enrollment says 'shared'",
        ),
        ({"provider": "someone"}, "registers provider 'someone', but its enrollment says 'gpuco'"),
        ({"region": "us-east"}, "registers region 'us-east'"),
        ({"address": "http://evil/"}, "is not a host name or IP address"),
        ({"sandbox": "unavailable", "sandbox_problem": "x" * 5_000}, "registration too large"),
        ({"sandbox": "kubernetes"}, "sandbox 'kubernetes' is the kernel's own Kubernetes nodes'"),
        ({"topology": {"galaxy": "g1"}}, "topology 'galaxy': 'g1': a level is one of clique, switch"),
        ({"topology": {"rack": "../victim/r1"}}, "topology 'rack': '../victim/r1'"),
        ({"topology": {"rack": "x" * 200}}, "a name 1-128 letters"),
    ):
        said = WorkerRegistered(**{"provider": "gpuco", "hostname": "h", "region": "eu-north", **lie})
        assert why in reason(claim(on, said, facts(enrolled=enrolled))), lie
    unenrolled = claim(on, honest, facts())
    assert isinstance(unenrolled, Refused) and unenrolled.unknown and "not enrolled" in unenrolled.reason
    node = "kernel-lab-gpu-1"  # the dispatcher's node-worker (only the operator enrolls that namespace)
    runs_images = WorkerRegistered(
        provider="gpuco", hostname="gpu-1", region="eu-north", sandbox="kubernetes"
    )
    on_node = worker_subject(node, runs_images)
    assert isinstance(
        claim(on_node, runs_images, facts(enrolled={node: enrolled[ME]}), sender=node), Accepted
    )
    assert "speaks only for itself" in reason(
        claim(worker_subject(OTHER, honest), honest, facts(enrolled=enrolled))
    )


def test_only_a_clusters_dispatcher_enrolls_its_own_new_nodes_under_its_terms() -> None:
    terms = EnrollmentTokenIssued(token_id="ct", token_sha256="x", expires_ns=T0, region="eu-north")
    events: list[tuple[str, Event, int]] = [
        ("provider.gpuco.created", ProviderCreated(display_name="GPU Co"), T0),
        ("provider.gpuco.enrollment_token_issued", terms, T0),
        (
            "provider.gpuco.cluster_enrolled",
            ClusterEnrolled(
                cluster="lab", token_id="ct", nats_user="dispatcher-lab", nats_password_bcrypt="h"
            ),
            T0,
        ),
        ("provider.gpuco.agent_enrolled", AgentEnrolled(token_id="ct", worker_id="kernel-lab-old"), T0),
    ]
    f = dataclasses.replace(facts(), providers=fold(PROVIDERS, events))
    node = AgentEnrolled(token_id="ct", worker_id="kernel-lab-gpu-a", hostname="gpu-a")
    on = "provider.gpuco.agent_enrolled"
    verdict = claim(on, node, f, sender="kernel-lab")
    assert isinstance(verdict, Accepted) and (verdict.subject, verdict.event) == (on, node)
    for sender, subject, lie, why in (
        ("kernel-other", on, {}, "kernel-other is no enrolled cluster's dispatcher"),
        (ME, on, {}, f"{ME} is no enrolled cluster's dispatcher"),  # a provider's agent
        ("kernel-lab", "provider.someone.agent_enrolled", {}, "enrolls nodes of provider gpuco only"),
        ("kernel-lab", on, {"token_id": "another"}, "enrolls under its cluster's terms"),
        ("kernel-lab", on, {"worker_id": "kernel-labx-a"}, "is not a node of cluster lab"),
        ("kernel-lab", on, {"worker_id": "w-0123456789ab"}, "is not a node of cluster lab"),
        ("kernel-lab", on, {"worker_id": "kernel-lab-a.b"}, "is not a node of cluster lab"),
        ("kernel-lab", on, {"nats_password_bcrypt": "$2b$08$x"}, "has no credentials of its own"),
        ("kernel-lab", on, {"worker_id": "kernel-lab-old"}, "is enrolled already"),
    ):
        said = msgspec.structs.replace(node, **lie)
        assert why in reason(claim(subject, said, f, sender=sender)), (sender, lie)
    revoked = [
        *events,
        ("provider.gpuco.cluster_credentials_revoked", ClusterCredentialsRevoked(cluster="lab"), T0),
    ]
    f = dataclasses.replace(f, providers=fold(PROVIDERS, revoked))
    assert "no enrolled cluster's dispatcher" in reason(claim(on, node, f, sender="kernel-lab"))


def test_a_cluster_name_another_provider_holds_live_is_not_taken() -> None:
    enrolled = ClusterEnrolled(
        cluster="lab", token_id="t", nats_user="dispatcher-lab", nats_password_bcrypt="h"
    )
    events: list[tuple[str, Event, int]] = [
        ("provider.a.created", ProviderCreated(display_name="A"), T0),
        ("provider.b.created", ProviderCreated(display_name="B"), T0),
        ("provider.a.cluster_enrolled", enrolled, T0),
        ("provider.b.cluster_enrolled", msgspec.structs.replace(enrolled, nats_password_bcrypt="mine"), T0),
    ]
    state = fold(PROVIDERS, events)
    assert state.dispatchers == {"kernel-lab": "a"} and "lab" not in state.providers["b"].clusters
    found = dispatching(state, "kernel-lab")
    assert found is not None and found[0] == "a" and found[1].nats_password_bcrypt == "h"


def test_probation_challenges_expires_and_retries() -> None:
    base = registered(ME)
    worker = fold(REGISTRY, base).workers[ME]
    assert worker.state == "unverified" and due(worker, T0).action == "challenge"  # type: ignore[union-attr]
    challenge = WorkerVerificationRequested(
        challenge_id="c1", seed="ab" * 16, size=256, rounds=5, deadline_s=120.0
    )
    asked = [*base, (worker_subject(ME, challenge), challenge, T0 + S)]
    open_one = fold(REGISTRY, asked).workers[ME]
    assert due(open_one, T0 + 60 * S) is None
    assert due(open_one, T0 + 122 * S).action == "expire"  # type: ignore[union-attr]
    failed = WorkerVerificationFailed(reason="no answer within 120s", challenge_id="c1")
    after = [*asked, (worker_subject(ME, failed), failed, T0 + 122 * S)]
    failed_one = fold(REGISTRY, after).workers[ME]
    assert failed_one.verification_reason == "verification failed: no answer within 120s"
    assert due(failed_one, T0 + 130 * S) is None
    assert due(failed_one, T0 + 123 * S + int(RETRY_AFTER_S * S)).action == "challenge"  # type: ignore[union-attr]
    passed = [*after, (worker_subject(ME, WorkerVerified), WorkerVerified(challenge_id="c2"), T0 + 500 * S)]
    verified = fold(REGISTRY, passed).workers[ME]
    assert verified.state == "available" and due(verified, T0 + 10_000 * S) is None


def test_new_gpus_need_a_new_verification() -> None:
    events = [*registered(ME), (worker_subject(ME, WorkerVerified), WorkerVerified(), T0 + S)]
    assert fold(REGISTRY, events).workers[ME].state == "available"
    same = registered(ME)
    assert fold(REGISTRY, events + same).workers[ME].state == "available"  # a restart: still verified
    more = registered(ME, gpus=1)
    changed = fold(REGISTRY, events + more).workers[ME]
    assert (changed.state, changed.verified) == ("unverified", False)
    assert "GPUs changed" in changed.verification_reason
