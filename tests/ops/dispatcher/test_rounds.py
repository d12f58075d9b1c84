"""The rules a dispatcher's round decides (:mod:`ops.dispatcher.rounds`), with fakes of what a
:class:`Rounds` is built from: a cluster that keeps what is applied (:mod:`tests.support.fake_cluster`:
the test is its kubelet), a list of the claims, a clock the test moves, and the real held-assignment
store in a temp state dir. No NATS, no Kubernetes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core import protocol
from core.reports import Append
from ops.dispatcher.cluster import ClusterRefused, ClusterUnreachable
from ops.dispatcher.endpoints import replica_name
from ops.dispatcher.reconcile import Held
from ops.dispatcher.rounds import UNREADABLE_WAIT_MS, Rounds
from ops.dispatcher.shards import job_name
from ops.dispatcher.state import HeldAssignments, Tracked, load_assignments
from schemas.commands import StartWork, WorkSpec
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady
from schemas.jobs import JobCheckpointed, JobFailed, JobProgress, JobShardCompleted, JobStarted
from schemas.metering import UsageTick
from tests.support.fake_cluster import CTX, NODE_PORT, FakeCluster, controller_of, namespace_of

WORKER, OTHER_WORKER = "kc-gpu-a", "kc-gpu-b"
NODE_ADDRESS = "10.0.0.7"
T0 = 1_800_000_000_000
KEY = "k" * 24


def job(slot: int = 0, *, work_id: str = "etl-1", epoch: int = 1) -> StartWork:
    spec = WorkSpec(runtime="process", command=["python3", "run.py"], shards=2, gpus=1)
    return StartWork(
        tenant="acme",
        work_id=work_id,
        work_kind="job",
        assignment_id=f"{work_id}-s{slot}-e{epoch}",
        slot=slot,
        epoch=epoch,
        spec=spec,
    )


def replica(slot: int = 0, *, runtime: str = "vllm") -> StartWork:
    return StartWork(
        tenant="acme",
        work_id="chat",
        work_kind="endpoint",
        assignment_id=f"chat-r{slot}-e1",
        slot=slot,
        epoch=1,
        spec=WorkSpec(runtime=runtime, options={"model": "org/model"}, gpus=1),
    )


RUNNING = {"running": {"startedAt": "2026-11-24T14:00:00Z"}}
EXITED_0 = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": "2026-11-24T14:05:00Z"}}


def progress(step: int) -> str:
    return f'2026-11-24T14:00:{step:02d}.000000000Z {protocol.PROGRESS} {{"step": {step}}}\n'


@dataclass
class Parts:
    """A :class:`Rounds` and the fakes it was built from."""

    rounds: Rounds
    cluster: FakeCluster
    held: HeldAssignments
    claims: list[tuple[str, Append]]
    """``(worker_id, claim)``, in the order claimed."""
    now: list[int]
    state_dir: Path
    busy: asyncio.Lock
    dead: set[str]
    """Workers whose node is not Ready."""

    def hold(self, cmd: StartWork, worker_id: str = WORKER) -> Tracked:
        """Hold ``cmd`` as the dispatcher does when its ``start_work`` comes (and keep it)."""
        key = KEY if cmd.work_kind == "endpoint" else ""
        tracked = Tracked(cmd=cmd, worker_id=worker_id, node="gpu-a", api_key=key)
        self.held[cmd.assignment_id] = tracked
        self.held.save()
        return tracked

    def events(self) -> list[Any]:
        return [event for _, (_, event, _) in self.claims]

    def take(self) -> list[Any]:
        """The events claimed since the last take."""
        events = self.events()
        self.claims.clear()
        return events

    def stored(self) -> dict[str, Tracked]:
        """What a restarted dispatcher would read from the state dir."""
        return load_assignments(self.state_dir)


LINGER_MS = 60_000


def build(tmp_path: Path, *, refused_rounds: int = 30) -> Parts:
    cluster, now, busy, dead = FakeCluster(), [T0], asyncio.Lock(), set[str]()
    claims: list[tuple[str, Append]] = []
    held = HeldAssignments(tmp_path)

    async def claim(worker_id: str, items: list[Append]) -> bool:
        claims.extend((worker_id, item) for item in items)
        return True

    rounds = Rounds(
        cluster=cluster,
        ctx=CTX,
        held=held,
        claim=claim,
        address_of=lambda worker_id: NODE_ADDRESS if worker_id == WORKER else None,
        busy=busy,
        ready=lambda worker_id: worker_id not in dead,
        refused_rounds=refused_rounds,
        linger_ms=LINGER_MS,
        clock=lambda: now[0],
    )
    return Parts(rounds, cluster, held, claims, now, tmp_path, busy, dead)


@pytest.fixture
def parts(tmp_path: Path) -> Parts:
    return build(tmp_path)


# --- applying ---------------------------------------------------------------------------------------


async def test_a_works_held_assignments_are_applied_together_and_remembered_applied(parts: Parts) -> None:
    parts.hold(job(0))
    parts.hold(job(1))
    await parts.rounds.apply("acme", "etl-1", "job")
    assert {controller_of(job(0)), controller_of(job(1))} <= set(parts.cluster.stored)
    assert [t.applied for t in parts.stored().values()] == [True, True]
    assert parts.claims == []


async def test_an_assignment_that_cannot_be_rendered_is_rejected_and_no_longer_held(parts: Parts) -> None:
    foreign = replica(runtime="process")  # a replica runs an inference engine, never a process
    parts.hold(foreign)
    await parts.rounds.apply("acme", "chat", "endpoint")
    [lost] = parts.events()
    assert isinstance(lost, EndpointReplicaLost) and lost.reason.startswith("rejected by worker")
    assert parts.held == {} and parts.stored() == {}
    assert parts.cluster.stored == {}  # nothing was applied


async def test_an_assignment_the_cluster_keeps_refusing_fails_after_the_refused_rounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    parts = build(tmp_path, refused_rounds=3)
    parts.hold(job())
    parts.cluster.failure = ClusterRefused("namespace is terminating", status=403, reason="Forbidden")
    for wait_ms in (1_000, 2_000):  # tried again after 1 s, then 2 s: never every round
        await parts.rounds.poll()
        assert parts.claims == [] and not parts.held[job().assignment_id].applied
        applies = parts.cluster.applies
        parts.now[0] += wait_ms - 1
        await parts.rounds.poll()
        assert parts.cluster.applies == applies
        parts.now[0] += 1
    await parts.rounds.poll()
    [failed] = parts.events()
    assert isinstance(failed, JobFailed) and not failed.retryable  # the same cluster would refuse again
    assert failed.reason == "cannot start: the cluster refused its objects: namespace is terminating"
    assert parts.held == {}
    said = [r.getMessage() for r in caplog.records if r.name == "resontech.dispatcher"]
    assert f"{job().assignment_id} refused (1 of 3): namespace is terminating" in said
    assert f"{job().assignment_id} not started: refused 3 times: namespace is terminating" in said


async def test_a_partly_applied_assignment_that_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    parts = build(tmp_path, refused_rounds=1)
    parts.hold(job(0))
    parts.cluster.partial = 3  # the namespace and two more objects, then a refusal
    await parts.rounds.poll()
    assert isinstance(parts.events()[0], JobFailed) and parts.held == {}
    assert parts.cluster.deleted == [f"Job {namespace_of(job())}/{job_name(1, 0)}"]
    parts.now[0] += LINGER_MS
    await parts.rounds.poll()
    assert parts.cluster.deleted[1:] == [f"Namespace {namespace_of(job())}"] and parts.cluster.stored == {}


async def test_an_assignment_the_cluster_did_not_answer_for_waits_for_the_next_round(parts: Parts) -> None:
    parts.hold(job())
    parts.cluster.failure = ClusterUnreachable("the API server timed out")
    for _ in range(40):  # never counted as a refusal
        with pytest.raises(ClusterUnreachable):
            await parts.rounds.poll()
    assert parts.claims == [] and not parts.stored()[job().assignment_id].applied
    parts.cluster.failure = None
    await parts.rounds.poll()
    assert parts.stored()[job().assignment_id].applied and parts.claims == []


async def test_a_round_waits_for_the_dispatchers_lock(parts: Parts) -> None:
    parts.hold(job())
    async with parts.busy:  # a command is being handled
        round_ = asyncio.create_task(parts.rounds.poll())
        await asyncio.sleep(0.01)
        assert not round_.done() and parts.cluster.stored == {}
    await round_
    assert parts.held[job().assignment_id].applied


async def test_a_log_read_holds_no_lock_and_an_assignment_let_go_meanwhile_claims_nothing(
    parts: Parts,
) -> None:
    tracked = parts.hold(job())
    await parts.rounds.poll()
    parts.cluster.run_pod(job(), "Running", RUNNING, log=progress(1))
    answer = asyncio.Event()
    reading = parts.cluster.pod_log

    async def slow(*args: Any, **kwargs: Any) -> str:
        await answer.wait()  # a kubelet taking its time
        return await reading(*args, **kwargs)

    parts.cluster.pod_log = slow  # type: ignore[method-assign]
    round_ = asyncio.create_task(parts.rounds.poll())
    await asyncio.sleep(0.01)
    async with asyncio.timeout(1), parts.busy:  # a command gets the lock while the round reads
        await parts.rounds.forget(tracked, final=[])
    answer.set()
    await round_
    assert parts.events() == [] and parts.held == {}  # nothing claimed for what was let go


# --- polling ----------------------------------------------------------------------------------------


async def test_a_pods_new_log_lines_are_claimed_once(parts: Parts) -> None:
    parts.hold(job())
    await parts.rounds.poll()
    parts.cluster.run_pod(job(), "Running", RUNNING, log=progress(1))
    await parts.rounds.poll()
    started, step_1 = parts.take()
    assert isinstance(started, JobStarted) and isinstance(step_1, JobProgress) and step_1.step == 1
    await parts.rounds.poll()
    assert parts.take() == []  # the same log: nothing new
    parts.cluster.run_pod(job(), "Running", RUNNING, log=progress(1) + progress(2))
    await parts.rounds.poll()
    [step_2] = parts.take()
    assert isinstance(step_2, JobProgress) and step_2.step == 2
    assert parts.stored()[job().assignment_id].said.started  # a restart reports nothing twice


def stamped(n: int, text: str) -> str:
    """Line ``n`` of a busy log: ten lines a second, with the kubelet's timestamp."""
    return f"2026-11-24T14:{n // 600:02d}:{n // 10 % 60:02d}.{n % 10}00000000Z {text}\n"


async def test_a_pod_that_writes_faster_than_a_read_loses_no_line(parts: Parts) -> None:
    parts.hold(job())
    await parts.rounds.poll()
    parts.cluster.run_pod(job(), "Running", RUNNING, log=stamped(0, "booting"))
    await parts.rounds.poll()
    parts.take()
    chatter = "x" * 200
    key = "jobs/etl-1/checkpoints/step-1500.pt"
    lines = [stamped(n, chatter) for n in range(1, 3000)]  # about 700 KiB: eleven reads' worth
    lines[1500] = stamped(1500, f'{protocol.CHECKPOINT} {{"object_key": "{key}", "step": 1500}}')
    lines.append(stamped(3000, f'{protocol.PROGRESS} {{"step": 3000}}'))
    parts.cluster.logs[pod_key(job())] += "".join(lines)
    await parts.rounds.poll()
    events = parts.take()
    assert [e.object_key for e in events if isinstance(e, JobCheckpointed)] == [key]
    assert [e.step for e in events if isinstance(e, JobProgress)] == [3000]
    assert len(parts.cluster.log_reads) > 10  # read forward, not a tail
    await parts.rounds.poll()
    assert parts.take() == []  # nothing twice


async def test_more_than_a_read_within_one_second_skips_to_the_tail_and_says_so(
    parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    parts.hold(job())
    await parts.rounds.poll()
    same_second = "".join(f"2026-11-24T14:00:01.{n:09d}Z {'y' * 300}\n" for n in range(400))
    parts.cluster.run_pod(job(), "Running", RUNNING, log=progress(0) + same_second + progress(2))
    await parts.rounds.poll()
    assert [e.step for e in parts.take() if isinstance(e, JobProgress)] == [2]  # the latest of the round
    assert any("lines of 2026-11-24T14:00:01Z skipped" in r.getMessage() for r in caplog.records)


async def test_a_pod_its_controller_has_not_made_yet_is_waited_for(parts: Parts) -> None:
    parts.hold(job())
    for _ in range(3):
        await parts.rounds.poll()
    assert parts.claims == [] and job().assignment_id in parts.held


async def test_an_applied_assignment_whose_objects_vanished_is_reported_lost(parts: Parts) -> None:
    parts.hold(job(0))
    parts.hold(job(1))
    await parts.rounds.poll()
    del parts.cluster.stored[controller_of(job(0))]  # deleted by hand
    await parts.rounds.poll()
    [lost] = parts.events()
    assert isinstance(lost, JobFailed) and lost.retryable and lost.assignment_id == job(0).assignment_id
    assert list(parts.held) == [job(1).assignment_id]


async def test_an_ended_shard_is_metered_a_last_time_then_claimed_and_its_namespace_deleted(
    parts: Parts,
) -> None:
    parts.hold(job())
    await parts.rounds.poll()
    parts.cluster.run_pod(job(), "Running", RUNNING)
    await parts.rounds.poll()
    parts.take()
    parts.now[0] = T0 + 5_000
    parts.cluster.run_pod(job(), "Succeeded", EXITED_0)
    await parts.rounds.poll()
    tick, done = parts.take()
    assert isinstance(tick, UsageTick) and (tick.start_ms, tick.end_ms, tick.gpu_ms) == (
        T0,
        T0 + 5_000,
        5_000,
    )
    assert isinstance(done, JobShardCompleted)
    assert parts.held == {} and parts.stored() == {}
    assert parts.cluster.deleted == [f"Job {namespace_of(job())}/{job_name(1, 0)}"]
    parts.now[0] += LINGER_MS  # the work's last assignment here: its namespace lingers, then goes
    await parts.rounds.poll()
    assert parts.cluster.deleted[1:] == [f"Namespace {namespace_of(job())}"]


async def test_a_replica_serves_at_its_nodes_address_and_its_services_node_port(parts: Parts) -> None:
    parts.hold(replica())
    await parts.rounds.poll()
    parts.cluster.run_pod(replica(), "Running", RUNNING, ready=True)
    await parts.rounds.poll()
    [ready] = [e for e in parts.events() if isinstance(e, EndpointReplicaReady)]
    assert ready.address == f"http://{NODE_ADDRESS}:{NODE_PORT}" and ready.api_key == KEY


# --- metering ---------------------------------------------------------------------------------------


async def test_each_running_assignment_is_ticked_as_its_worker_and_none_before_its_pod_ran(
    parts: Parts,
) -> None:
    parts.hold(job(0), WORKER)
    parts.hold(job(1), OTHER_WORKER)
    await parts.rounds.poll()
    parts.cluster.run_pod(job(0), "Running", RUNNING)  # slot 1's pod is not made yet
    await parts.rounds.poll()
    parts.claims.clear()
    parts.now[0] = T0 + 10_000
    await parts.rounds.meter()
    [(worker_id, (_, tick, event_id))] = parts.claims
    assert worker_id == WORKER and isinstance(tick, UsageTick)
    assert (tick.assignment_id, tick.start_ms, tick.end_ms) == (job(0).assignment_id, T0, T0 + 10_000)
    parts.claims.clear()
    await parts.rounds.meter()
    assert parts.claims == []  # no time passed: no tick
    parts.now[0] = T0 + 20_000
    await parts.rounds.meter()
    [(_, (_, later, next_id))] = parts.claims
    assert isinstance(later, UsageTick) and later.start_ms == T0 + 10_000  # contiguous
    assert next_id != event_id  # a new tick, never a duplicate of the last one
    assert parts.stored()[job(0).assignment_id].metered_ms == T0 + 20_000  # a restart meters on


# --- forgetting -------------------------------------------------------------------------------------


async def test_forgetting_deletes_an_assignments_job_and_the_namespace_lingers_after_the_works_last(
    parts: Parts,
) -> None:
    first, second = parts.hold(job(0)), parts.hold(job(1))
    await parts.rounds.poll()
    ns = namespace_of(job())
    await parts.rounds.forget(first, final=[])
    assert parts.cluster.deleted == [f"Job {ns}/{job_name(1, 0)}"]
    await parts.rounds.forget(second, final=[])
    assert parts.cluster.deleted[1:] == [f"Job {ns}/{job_name(1, 1)}"]
    parts.now[0] += LINGER_MS - 1
    await parts.rounds.poll()
    assert len(parts.cluster.deleted) == 2
    parts.now[0] += 1
    await parts.rounds.poll()
    assert parts.cluster.deleted[2:] == [f"Namespace {ns}"]
    assert parts.held == {} and parts.claims == []


async def test_a_shard_placed_again_while_its_namespace_lingers_keeps_the_namespace(parts: Parts) -> None:
    """A node lost: the kernel stops the old epoch, then places the shard again here. The namespace
    must not go in between: a dead node's pod would hold it terminating, refusing the replacement."""
    old = parts.hold(job(0))
    await parts.rounds.poll()
    await parts.rounds.forget(old, final=[])  # the stop of the old epoch came first
    parts.now[0] += LINGER_MS // 2
    parts.hold(job(0, epoch=2))
    parts.now[0] += LINGER_MS
    await parts.rounds.poll()
    ns = namespace_of(job())
    assert parts.cluster.deleted == [f"Job {ns}/{job_name(1, 0)}"]  # the old epoch's own objects only
    assert ("batch/v1", "Job", ns, job_name(2, 0)) in parts.cluster.stored
    assert parts.held[job(0, epoch=2).assignment_id].applied


async def test_forgetting_a_replica_deletes_its_deployment_and_its_service(parts: Parts) -> None:
    first, _ = parts.hold(replica(0)), parts.hold(replica(1))
    await parts.rounds.poll()
    await parts.rounds.forget(first, final=[])
    name, ns = replica_name(replica(0)), namespace_of(replica())
    assert parts.cluster.deleted == [f"Deployment {ns}/{name}", f"Service {ns}/{name}"]


async def test_what_was_never_applied_is_deleted_all_the_same(parts: Parts) -> None:
    tracked = parts.hold(job())  # an apply may stop half way: nothing says what is there
    await parts.rounds.forget(tracked, final=[])
    assert parts.cluster.deleted == [f"Job {namespace_of(job())}/{job_name(1, 0)}"]
    assert parts.held == {} and parts.stored() == {}


# --- after a restart --------------------------------------------------------------------------------


async def test_reconciling_deletes_what_the_kernel_no_longer_assigns_and_reports_lost_what_vanished(
    parts: Parts,
) -> None:
    one, two, three = job(work_id="etl-1"), job(work_id="etl-2"), job(work_id="etl-3")
    for cmd in (one, two, three):
        parts.hold(cmd)
    await parts.rounds.poll()
    for cmd in (one, two, three):
        parts.cluster.run_pod(cmd, "Running", RUNNING)
    await parts.rounds.poll()
    parts.take()
    parts.now[0] += 60_000
    del parts.cluster.stored[controller_of(one)]  # etl-1's Job vanished; etl-2 was cancelled meanwhile
    await parts.rounds.reconcile([held(one), held(three)])
    assert parts.cluster.deleted == [
        f"Job {namespace_of(two)}/{job_name(1, 0)}",
        f"Namespace {namespace_of(two)}",
        f"Job {namespace_of(one)}/{job_name(1, 0)}",
    ]
    tick, lost = parts.take()  # nothing at all is claimed for etl-2: the kernel no longer has it
    assert isinstance(tick, UsageTick) and tick.assignment_id == one.assignment_id
    assert isinstance(lost, JobFailed) and lost.retryable and lost.assignment_id == one.assignment_id
    assert lost.reason == "its objects vanished from the cluster"
    assert list(parts.held) == [three.assignment_id]


def pod_key(cmd: StartWork) -> tuple[str, str]:
    """``(namespace, name)`` of the pod :meth:`FakeCluster.run_pod` makes for ``cmd``."""
    _, _, ns, name = controller_of(cmd)
    return ns, f"{name}-pod"


def pod_of(cmd: StartWork) -> str:
    """``namespace/name`` of the pod :meth:`FakeCluster.run_pod` makes for ``cmd``."""
    _, _, ns, name = controller_of(cmd)
    return f"{ns}/{name}-pod"


def held(cmd: StartWork) -> Held:
    return Held(cmd.assignment_id, cmd.tenant, cmd.work_id, cmd.work_kind)


async def test_a_log_that_cannot_be_read_stalls_no_other_pod_and_a_not_ready_nodes_is_not_asked(
    parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    stuck, fine, dead = job(work_id="etl-1"), job(work_id="etl-2"), job(work_id="etl-3")
    parts.hold(stuck)
    parts.hold(fine)
    parts.hold(dead, worker_id=OTHER_WORKER)
    await parts.rounds.poll()
    for cmd in (stuck, fine, dead):
        parts.cluster.run_pod(cmd, "Running", RUNNING, log=progress(1))
    parts.cluster.unreadable.add(pod_of(stuck))
    parts.dead.add(OTHER_WORKER)
    await parts.rounds.poll()
    await parts.rounds.poll()
    progressed = {e.assignment_id for e in parts.events() if isinstance(e, JobProgress)}
    assert progressed == {fine.assignment_id}
    assert pod_of(dead) not in parts.cluster.log_reads
    said = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert len(said) == 1 and "kubelet did not answer" in said[0]  # once, not every round
    assert parts.cluster.log_reads.count(pod_of(stuck)) == 1  # not asked again for a while
    parts.cluster.unreadable.clear()
    parts.now[0] += UNREADABLE_WAIT_MS
    await parts.rounds.poll()
    assert stuck.assignment_id in {e.assignment_id for e in parts.events() if isinstance(e, JobProgress)}
