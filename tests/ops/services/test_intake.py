"""The intake's own rules (:mod:`ops.services.intake`): what it does with each kind of claim an agent
sends, with a fake of its log (:mod:`tests.ops.services.fakes`: it enforces expected sequences and
event ids as JetStream does, and feeds the intake's real projection runners) and a clock the test
moves. What the judge decides of one claim is in :mod:`tests.projections.test_claims`; the same rules
with real credentials and a real server are in :mod:`tests.e2e.trust.test_claims`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pytest

from core import addresses, verification
from core.errors import LogUnavailable
from core.log import EventLog
from core.streams import (
    command_subject,
    endpoint_subject,
    intake_subject,
    job_subject,
    metering_subject,
    provider_subject,
    worker_subject,
)
from ops.services import intake as intake_module
from ops.services.budgets import WINDOW_S, AgentBudgets, Budget
from ops.services.intake import CLOCK_MARGIN_NS, NOTICE_EVERY_S, PROGRESS, RETRY_S, Intake
from schemas._base import Event
from schemas.commands import RegistrationRefused
from schemas.endpoints import EndpointDeployed, EndpointReplicaPlaced, EndpointReplicaReady
from schemas.jobs import JobPlaced, JobProgress, JobResources, JobStarted, JobSubmitted
from schemas.metering import UsageTick
from schemas.providers import AgentEnrolled, EnrollmentTokenIssued, ProviderCreated
from schemas.values import Assignment, Provenance
from schemas.workers import (
    WorkerCordoned,
    WorkerPolicy,
    WorkerPolicySet,
    WorkerRegistered,
    WorkerVerificationFailed,
    WorkerVerificationReported,
    WorkerVerificationRequested,
    WorkerVerified,
)
from tests.ops.coordinator.fakes import NOW
from tests.ops.services.fakes import Claim, FakeTime, IntakeLog, Quarantined

S = 1_000_000_000
ME, OTHER = "w-mallory", "w-honest"
A1, A2 = "j1-s0-e1", "j1-s1-e1"
PLACED_MS = (NOW - 60 * S) // 1_000_000
SEED = "ab" * 16


@dataclass
class Kernel:
    """An intake on a fake log, and the facts the test stores there."""

    log: IntakeLog
    intake: Intake
    clock: FakeTime

    async def handle(self, *claims: Claim) -> None:
        await self.intake.handle(list(claims))

    def workers(self, *ids: str) -> None:
        for worker_id in ids:
            registered = WorkerRegistered(
                provider="gpuco", hostname=f"{worker_id}.example", address="10.0.0.7"
            )
            self.log.store(worker_subject(worker_id, registered), registered, NOW - 3600 * S)
        self.log.deliver()

    def placed(self, on: Sequence[str] = (ME, OTHER), *, deliver: bool = True) -> None:
        """Job ``acme/j1`` with shard ``n`` (assignment ``j1-s<n>-e1``) placed on ``on[n]``."""
        submitted = JobSubmitted(
            name="train", kind="process", shards=len(on), resources=JobResources(cpus=1.0)
        )
        shards = [
            Assignment(assignment_id=f"j1-s{n}-e1", worker_id=worker, slot=n, epoch=1)
            for n, worker in enumerate(on)
        ]
        placed = JobPlaced(assignments=shards, provenance=Provenance(candidates=len(on)))
        self.log.store(job_subject("acme", "j1", submitted), submitted, NOW - 120 * S)
        self.log.store(job_subject("acme", "j1", placed), placed, NOW - 60 * S)
        if deliver:
            self.log.deliver()

    def enrolled(self, worker_id: str) -> None:
        events: list[Event] = [
            ProviderCreated(display_name="GPU Co"),
            EnrollmentTokenIssued(token_id="t1", token_sha256="x", expires_ns=NOW * 2),
            AgentEnrolled(token_id="t1", worker_id=worker_id),
        ]
        for event in events:
            self.log.store(provider_subject("gpuco", event), event, NOW - 3600 * S)
        self.log.deliver()


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    clock = FakeTime()
    monkeypatch.setattr(intake_module, "time", clock)
    log = IntakeLog()
    # the fake has what the intake calls of its log (anything else fails loudly: no server behind it)
    intake = Intake(
        cast(EventLog, log),
        kernel_addresses=frozenset({"10.0.0.1:4222"}),
        replica_networks=addresses.parse_networks("10.0.0.0/8"),
    )
    log.follow(intake.runners)
    return Kernel(log, intake, clock)


def progress(assignment: str = A1, step: int = 1) -> tuple[str, JobProgress]:
    report = JobProgress(assignment_id=assignment, slot=0 if assignment == A1 else 1, epoch=1, step=step)
    return job_subject("acme", "j1", report), report


# -- reports -------------------------------------------------------------------------------------


async def test_a_claim_that_holds_is_appended_as_the_kernels_event_once_under_its_claims_id(
    kernel: Kernel,
) -> None:
    kernel.workers(ME, OTHER)
    kernel.placed()
    started = JobStarted(assignment_id=A1, worker_id=ME, slot=0, epoch=1)
    on = job_subject("acme", "j1", started)
    first = Claim(7, ME, on, started)
    await kernel.handle(first)
    [record] = kernel.log.appended
    assert (record.subject, record.event, record.msg_id) == (on, started, "intake-7")
    assert first.outcome == "acked" and kernel.intake.accepted == 1 and not kernel.log.quarantined
    again = Claim(7, ME, on, started, delivered=2)  # the intake stopped before acknowledging it
    await kernel.handle(again)
    assert len(kernel.log.appended) == 1 and again.outcome == "acked"


async def test_a_claim_that_does_not_hold_is_quarantined_with_the_reason_and_its_sender(
    kernel: Kernel,
) -> None:
    kernel.workers(ME, OTHER)
    kernel.placed()
    theirs = JobStarted(assignment_id=A2, worker_id=ME, slot=1, epoch=1)
    on = job_subject("acme", "j1", theirs)
    claim = Claim(8, ME, on, theirs)
    await kernel.handle(claim)
    assert kernel.log.quarantined == [
        Quarantined(
            "INTAKE", 8, intake_subject(ME, on), f"assignment {A2} belongs to worker {OTHER}, not {ME}", ME
        )
    ]
    assert claim.outcome == "acked" and kernel.intake.refused == 1 and not kernel.log.appended


async def test_what_the_kernel_cannot_read_is_quarantined_and_acknowledged(kernel: Kernel) -> None:
    garbled = Claim(1, ME, "job.acme.j1.started", data=b"{not json")
    no_subject = Claim(2, ME, "", data=b"{}", raw_subject=f"intake.{ME}")
    no_family = Claim(3, ME, "nonsense.acme.x", data=b"{}")
    await kernel.handle(garbled, no_subject, no_family)
    assert [(q.seq, q.sender) for q in kernel.log.quarantined] == [(1, ME), (2, ME), (3, ME)]
    assert all(r.startswith("not a claim the kernel reads: ") for r in kernel.log.reasons())
    assert [c.outcome for c in (garbled, no_subject, no_family)] == ["acked"] * 3
    assert not kernel.log.appended


async def test_a_claim_the_log_cannot_take_is_delivered_again_neither_acked_nor_refused(
    kernel: Kernel,
) -> None:
    kernel.workers(ME, OTHER)
    kernel.placed()
    started = JobStarted(assignment_id=A1, worker_id=ME, slot=0, epoch=1)
    theirs = JobStarted(assignment_id=A2, worker_id=ME, slot=1, epoch=1)
    kernel.log.refuse = {"job.": LogUnavailable("no leader"), "QUARANTINE": LogUnavailable("no leader")}
    held, refused = (
        Claim(1, ME, job_subject("acme", "j1", started), started),
        Claim(2, ME, "job.acme.j1.started", theirs),
    )
    await kernel.handle(held, refused)
    assert [(c.outcome, c.retry_s) for c in (held, refused)] == [("retried", RETRY_S)] * 2
    assert not kernel.log.appended and not kernel.log.quarantined
    kernel.log.refuse = {}
    await kernel.handle(held, refused)
    assert kernel.log.events() == [started] and len(kernel.log.quarantined) == 1
    assert [c.outcome for c in (held, refused)] == ["acked", "acked"]


# -- the kernel's lag ----------------------------------------------------------------------------


async def test_a_claim_about_what_the_projections_do_not_know_yet_is_judged_again_once_caught_up(
    kernel: Kernel,
) -> None:
    kernel.workers(ME, OTHER)
    kernel.placed(deliver=False)  # appended a moment ago: the intake's projections have not applied it
    on, report = progress()
    unknown = JobProgress(assignment_id="j9-s0-e1", slot=0, epoch=1)
    await kernel.handle(Claim(1, ME, on, report), Claim(2, ME, job_subject("acme", "j9", unknown), unknown))
    assert kernel.log.events() == [report]
    assert kernel.log.reasons() == ["no job acme/j9"]
    assert kernel.log.asked > 0


async def test_a_claim_stored_before_the_last_catch_up_is_judged_without_catching_up_again(
    kernel: Kernel,
) -> None:
    unknown = JobProgress(assignment_id="j9-s0-e1", slot=0, epoch=1)
    on = job_subject("acme", "j9", unknown)
    await kernel.intake.catch_up()  # at NOW by the intake's clock
    asked = kernel.log.asked
    await kernel.handle(Claim(1, ME, on, unknown, time_ns=NOW - CLOCK_MARGIN_NS - 1))
    assert kernel.log.asked == asked and kernel.log.reasons() == ["no job acme/j9"]
    await kernel.handle(Claim(2, ME, on, unknown, time_ns=NOW - CLOCK_MARGIN_NS))
    assert kernel.log.asked > asked and len(kernel.log.quarantined) == 2


async def test_a_claim_about_an_earlier_claim_of_its_batch_is_judged_on_it_even_from_a_backlog(
    kernel: Kernel,
) -> None:
    """An intake started behind a backlog (a dispatcher's registrations and cordons, queued while the
    intake was away): the policy claimed after a registration, both stored before the intake caught up,
    is judged once the registration it names is applied."""
    kernel.enrolled(ME)
    await kernel.intake.catch_up()  # at NOW by the intake's clock
    then = NOW - CLOCK_MARGIN_NS - 1
    registered = WorkerRegistered(provider="gpuco", hostname="h")
    policy = WorkerPolicySet(policy=WorkerPolicy(max_concurrent=0))
    await kernel.handle(
        Claim(1, ME, worker_subject(ME, registered), registered, time_ns=then),
        Claim(2, ME, worker_subject(ME, policy), policy, time_ns=then),
    )
    assert kernel.log.events() == [registered, policy] and kernel.log.reasons() == []
    # and once caught up after its own appends, a batch does not catch up again for each claim
    asked = kernel.log.asked
    await kernel.intake.catch_up()
    one_catch_up, asked = kernel.log.asked - asked, kernel.log.asked
    again = WorkerPolicySet(policy=WorkerPolicy())
    unknown = JobProgress(assignment_id="j9-s0-e1", slot=0, epoch=1)
    nowhere = [Claim(n, ME, job_subject("acme", "j9", unknown), unknown, time_ns=then) for n in (4, 5, 6)]
    await kernel.handle(Claim(3, ME, worker_subject(ME, again), again, time_ns=then), *nowhere)
    assert kernel.log.reasons() == ["no job acme/j9"] * 3 and kernel.log.asked - asked == one_catch_up


# -- registrations -------------------------------------------------------------------------------


async def test_a_refused_registration_is_quarantined_and_its_agent_told_at_most_once_a_minute(
    kernel: Kernel,
) -> None:
    kernel.enrolled(ME)
    honest = WorkerRegistered(provider="gpuco", hostname="h")
    await kernel.handle(Claim(1, ME, worker_subject(ME, honest), honest))
    assert kernel.log.events() == [honest]
    stranger = WorkerRegistered(provider="gpuco", hostname="x")
    on = worker_subject(OTHER, stranger)
    await kernel.handle(Claim(2, OTHER, on, stranger), Claim(3, OTHER, on, stranger))
    told = [r for r in kernel.log.appended if isinstance(r.event, RegistrationRefused)]
    assert [r.subject for r in told] == [command_subject(OTHER)]
    assert told[0].event.reason == kernel.log.reasons()[0] and len(kernel.log.quarantined) == 2
    assert "not enrolled" in told[0].event.reason
    kernel.clock.monotonic_s += NOTICE_EVERY_S
    await kernel.handle(Claim(4, OTHER, on, stranger))
    assert len(kernel.log.events(RegistrationRefused)) == 2


# -- progress and budgets ------------------------------------------------------------------------


async def test_progress_is_capped_per_assignment_by_store_time(kernel: Kernel) -> None:
    kernel.workers(ME)
    kernel.placed(on=(ME, ME))
    burst, per_s = int(PROGRESS.burst), int(PROGRESS.per_s)
    flood = [Claim(n, ME, *progress(A1, n)) for n in range(1, burst + 2)]
    other = Claim(100, ME, *progress(A2))
    await kernel.handle(*flood, other)
    assert [e.assignment_id for e in kernel.log.events(JobProgress)] == [A1] * burst + [A2]
    assert kernel.log.reasons() == [f"more than {PROGRESS.per_s:g} progress reports a second"]
    assert all(c.outcome == "acked" for c in (*flood, other))
    later = [Claim(200 + n, ME, *progress(A1, 200 + n), time_ns=NOW + S) for n in range(per_s + 1)]
    await kernel.handle(*later)
    assert len(kernel.log.events(JobProgress)) == burst + 1 + per_s and len(kernel.log.quarantined) == 2


async def test_a_flooding_agent_is_refused_once_a_window_and_dropped_without_slowing_others(
    kernel: Kernel,
) -> None:
    kernel.workers(ME, OTHER)
    kernel.placed()
    kernel.intake.budgets = AgentBudgets(claims=Budget(per_s=1.0, burst=3.0))
    started = JobStarted(assignment_id=A1, worker_id=ME, slot=0, epoch=1)
    mine = job_subject("acme", "j1", started)
    flood = [Claim(n, ME, mine, started) for n in range(1, 11)]
    honest = [Claim(100 + n, OTHER, *progress(A2, n)) for n in range(2)]
    await kernel.handle(*flood[:5], honest[0], *flood[5:], honest[1])
    over = f"worker {ME} is over its budget of 1 claims a second (burst 3)"
    assert [(q.seq, q.reason.startswith(over)) for q in kernel.log.quarantined] == [(4, True)]
    assert kernel.intake.dropped == 6
    assert [r.msg_id for r in kernel.log.appended] == [
        "intake-1",
        "intake-2",
        "intake-3",
        "intake-100",
        "intake-101",
    ]
    assert all(c.outcome == "acked" for c in (*flood, *honest))
    next_window = [Claim(20 + n, ME, mine, started, time_ns=NOW + int(WINDOW_S * S)) for n in range(4)]
    await kernel.handle(*next_window)
    assert kernel.log.quarantined[-1].seq == 23
    assert kernel.log.reasons()[-1].endswith("(6 dropped in its last window)")


async def test_verification_answers_have_a_budget_of_their_own(kernel: Kernel) -> None:
    answer = WorkerVerificationReported(challenge_id="c1", checksum="00")
    on = worker_subject(ME, answer)
    await kernel.handle(*(Claim(n, ME, on, answer) for n in range(1, 5)))
    reasons = kernel.log.reasons()
    assert reasons[:3] == [f"worker {ME} has no open verification challenge"] * 3
    assert reasons[3].startswith(f"worker {ME} is over its budget of 0.1 verification answers a second")


# -- usage ---------------------------------------------------------------------------------------


def tick(start_s: int, end_s: int, assignment: str = A1) -> tuple[str, UsageTick]:
    """A CPU tick of ``assignment`` from ``start_s`` to ``end_s`` seconds after its placement."""
    claimed = UsageTick(
        work_id="j1",
        work_kind="job",
        assignment_id=assignment,
        epoch=1,
        start_ms=PLACED_MS + start_s * 1000,
        end_ms=PLACED_MS + end_s * 1000,
        cpu_ms=(end_s - start_s) * 500,
        provider="anyone",
        gpu_type="H100",
        pool="managed",
        tier="platinum",
    )
    return metering_subject("acme", ME, assignment, UsageTick), claimed


async def test_ticks_are_appended_in_order_at_their_subjects_expected_sequence_with_the_kernels_facts(
    kernel: Kernel,
) -> None:
    kernel.workers(ME)
    kernel.placed(on=(ME, ME))
    (s1, first), (_, second), (s2, theirs) = tick(0, 10), tick(10, 20), tick(0, 10, A2)
    claims = [Claim(1, ME, s1, first), Claim(2, ME, s2, theirs), Claim(3, ME, s1, second)]
    await kernel.handle(*claims)
    assert all(c.outcome == "acked" for c in claims) and kernel.intake.accepted == 3
    billed = [(r.msg_id, r.event.start_ms) for r in kernel.log.appended if r.subject == s1]
    assert billed == [("intake-1", first.start_ms), ("intake-3", second.start_ms)]
    stored = kernel.log.events(UsageTick)[0]
    assert (stored.provider, stored.gpu_type) == ("gpuco", "cpu")  # the kernel's, never the claim's
    _, overlapping = tick(15, 25)
    await kernel.handle(Claim(4, ME, s1, overlapping))
    assert kernel.log.reasons() == [
        f"interval [{overlapping.start_ms}, {overlapping.end_ms}] ms overlaps usage already billed up to "
        f"{second.end_ms} ms"
    ]


async def test_a_tick_another_instance_billed_meanwhile_is_read_again_and_judged_again(
    kernel: Kernel,
) -> None:
    kernel.workers(ME)
    kernel.placed(on=(ME, ME))
    (s1, first), (_, second), (_, third) = tick(0, 10), tick(10, 20), tick(20, 30)
    await kernel.handle(Claim(1, ME, s1, first))
    kernel.log.store(s1, second, msg_id="intake-2")  # another intake took claim 2
    same, after = Claim(5, ME, s1, second), Claim(6, ME, s1, third)
    await kernel.handle(same, after)
    billed = f"overlaps usage already billed up to {second.end_ms} ms"
    assert kernel.log.reasons() == [f"interval [{second.start_ms}, {second.end_ms}] ms {billed}"]
    assert [r.msg_id for r in kernel.log.appended] == ["intake-1", "intake-6"]
    assert same.outcome == after.outcome == "acked"


async def test_a_tick_delivered_again_after_it_was_stored_is_not_billed_or_refused_again(
    kernel: Kernel,
) -> None:
    kernel.workers(ME)
    kernel.placed(on=(ME, ME))
    s1, first = tick(0, 10)
    kernel.log.store(s1, first, msg_id="intake-7")  # stored before the intake restarted unacknowledged
    again = Claim(7, ME, s1, first, delivered=2)
    await kernel.handle(again)
    assert again.outcome == "acked" and not kernel.log.appended and not kernel.log.quarantined
    await kernel.handle(Claim(8, ME, s1, first))  # the same interval claimed anew
    assert "overlaps usage already billed" in kernel.log.reasons()[0]


async def test_ticks_the_log_cannot_take_are_delivered_again_in_order_others_go_on(kernel: Kernel) -> None:
    kernel.workers(ME)
    kernel.placed(on=(ME, ME))
    (s1, first), (_, second), (s2, theirs) = tick(0, 10), tick(10, 20), tick(0, 10, A2)
    kernel.log.refuse = {s1: LogUnavailable("no leader")}
    held = [Claim(1, ME, s1, first), Claim(3, ME, s1, second)]
    other = Claim(2, ME, s2, theirs)
    await kernel.handle(held[0], other, held[1])
    assert [c.outcome for c in held] == ["retried", "retried"] and other.outcome == "acked"
    assert [r.subject for r in kernel.log.appended] == [s2] and not kernel.log.quarantined


# -- verification --------------------------------------------------------------------------------


def challenged(kernel: Kernel) -> WorkerVerificationRequested:
    """Worker ``ME`` (a CPU host) with an open challenge, small enough to answer at once."""
    kernel.workers(ME, OTHER)
    request = WorkerVerificationRequested(challenge_id="c1", seed=SEED, size=16, rounds=1, deadline_s=120.0)
    kernel.log.store(worker_subject(ME, request), request, NOW - 10 * S)
    kernel.log.deliver()
    return request


def answer(checksum: str | None = None) -> WorkerVerificationReported:
    right = verification.answer(SEED, 16, 1)
    return WorkerVerificationReported(challenge_id="c1", checksum=checksum or right, elapsed_ms=50)


async def test_a_right_answer_is_the_kernels_verified_at_the_workers_expected_sequence(
    kernel: Kernel,
) -> None:
    challenged(kernel)
    report = answer()
    await kernel.handle(Claim(1, ME, worker_subject(ME, report), report))
    [record] = kernel.log.appended  # the fake refuses it unless it expects the worker's last sequence
    assert (record.subject, record.msg_id) == (worker_subject(ME, WorkerVerified), "intake-1")
    assert record.event == WorkerVerified(challenge_id="c1", elapsed_ms=50, by="intake")
    wrong = answer("00" * 32)
    await kernel.handle(Claim(2, ME, worker_subject(ME, wrong), wrong))
    assert not kernel.log.events(WorkerVerificationFailed)  # the challenge is closed: nothing to answer
    assert kernel.log.reasons() == [f"worker {ME} has no open verification challenge"]


async def test_a_wrong_answer_is_the_kernels_verification_failed_with_the_reason(kernel: Kernel) -> None:
    challenged(kernel)
    wrong = answer("00" * 32)
    await kernel.handle(Claim(1, ME, worker_subject(ME, wrong), wrong))
    [failed] = kernel.log.events()
    assert isinstance(failed, WorkerVerificationFailed) and failed.challenge_id == "c1"
    assert failed.reason.startswith("wrong checksum for the 16x16 x 1 rounds benchmark")
    assert kernel.intake.accepted == 1 and not kernel.log.quarantined


async def test_a_worker_answers_only_its_own_challenge(kernel: Kernel) -> None:
    challenged(kernel)
    report = answer()
    on = worker_subject(ME, report)
    await kernel.handle(Claim(1, OTHER, on, report))
    assert kernel.log.reasons() == [f"a worker answers only its own verification: {on}"]
    assert not kernel.log.appended


async def test_an_answer_for_a_worker_that_changed_meanwhile_is_judged_against_what_it_is_now(
    kernel: Kernel,
) -> None:
    challenged(kernel)
    cordoned = WorkerCordoned(reason="disk full", by="ops")
    kernel.log.store(worker_subject(ME, cordoned), cordoned)  # not applied yet: the append conflicts
    report = answer()
    await kernel.handle(Claim(1, ME, worker_subject(ME, report), report))
    [record] = kernel.log.appended
    assert isinstance(record.event, WorkerVerified) and kernel.log.asked > 0


async def test_an_answer_to_a_challenge_that_expired_meanwhile_is_refused(kernel: Kernel) -> None:
    challenged(kernel)
    expired = WorkerVerificationFailed(reason="no answer within 120s", challenge_id="c1")
    kernel.log.store(worker_subject(ME, expired), expired)  # the verifier's, as the answer came in
    report = answer()
    await kernel.handle(Claim(1, ME, worker_subject(ME, report), report))
    assert kernel.log.reasons() == [f"worker {ME} has no open verification challenge"]
    assert not kernel.log.appended


# -- replica addresses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resolves_to", "accepted"),
    [(("10.0.0.9",), True), (("127.0.0.1",), False), (("10.0.0.9", "192.168.1.1"), False), ((), False)],
)
async def test_a_replicas_host_name_is_looked_up_and_judged_by_what_it_resolves_to(
    kernel: Kernel, monkeypatch: pytest.MonkeyPatch, resolves_to: tuple[str, ...], accepted: bool
) -> None:
    looked_up: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> tuple[str, ...]:
        looked_up.append((host, port))
        return resolves_to

    monkeypatch.setattr(addresses, "resolve", resolve)
    kernel.workers(ME)
    deployed = EndpointDeployed(name="chat", model="m")
    replica = Assignment(assignment_id="e1-s0-e1", worker_id=ME, slot=0, epoch=1)
    placed = EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1))
    for event in (deployed, placed):
        kernel.log.store(endpoint_subject("acme", "e1", event), event, NOW - 60 * S)
    kernel.log.deliver()
    by_name = EndpointReplicaReady(assignment_id="e1-s0-e1", epoch=1, address=f"http://{ME}.example:8000")
    by_ip = EndpointReplicaReady(assignment_id="e1-s0-e1", epoch=1, address="http://10.0.0.7:8000")
    on = endpoint_subject("acme", "e1", by_name)
    await kernel.handle(Claim(1, ME, on, by_name), Claim(2, ME, on, by_ip))
    assert looked_up == [(f"{ME}.example", 8000)]  # an IP address is judged as it is
    assert kernel.log.events() == ([by_name, by_ip] if accepted else [by_ip])
    if not accepted:
        assert kernel.log.reasons()[0].startswith(f"address 'http://{ME}.example:8000': ")
