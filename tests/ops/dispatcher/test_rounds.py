"""The rules a dispatcher's round decides (:mod:`ops.dispatcher.rounds`), with fakes of what a
:class:`Rounds` is built from: a cluster that keeps what is applied (the test is its kubelet: it makes
pods from the applied controllers' templates and writes their logs), a list of the claims, a clock the
test moves, and the real held-assignment store in a temp state dir. No NATS, no Kubernetes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core import protocol
from core.errors import NotFound
from core.reports import Append
from ops.dispatcher.cluster import ClusterRefused, ClusterUnreachable, Json, Namespace
from ops.dispatcher.context import RenderContext
from ops.dispatcher.endpoints import replica_name
from ops.dispatcher.manifests import work_namespace
from ops.dispatcher.podstate import PodState, pod_state
from ops.dispatcher.reporting import WORKLOAD_CONTAINER
from ops.dispatcher.rounds import Rounds
from ops.dispatcher.shards import job_name
from ops.dispatcher.state import HeldAssignments, Tracked, load_assignments
from schemas.commands import StartWork, WorkSpec
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady
from schemas.jobs import JobFailed, JobProgress, JobShardCompleted, JobStarted
from schemas.metering import UsageTick

CTX = RenderContext()
WORKER, OTHER_WORKER = "kc-gpu-a", "kc-gpu-b"
NODE_ADDRESS = "10.0.0.7"
NODE_PORT = 30123
T0 = 1_800_000_000_000
KEY = "k" * 24
Key = tuple[str, str, str | None, str]
"""``(apiVersion, kind, namespace, name)`` of an object in the fake cluster."""


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


def namespace_of(cmd: StartWork) -> str:
    return work_namespace(cmd.tenant, cmd.work_id, cmd.work_kind, CTX)


def controller_of(cmd: StartWork) -> Key:
    if cmd.work_kind == "job":
        return "batch/v1", "Job", namespace_of(cmd), job_name(cmd.epoch, cmd.slot)
    return "apps/v1", "Deployment", namespace_of(cmd), replica_name(cmd)


class FakeCluster:
    """The cluster as the rounds use it: applied objects by key; pods and logs as the test puts them.

    Like the API server, it gives a Service a node port when it is created. ``failure`` is raised by
    every apply while set.
    """

    def __init__(self) -> None:
        self.stored: dict[Key, Json] = {}
        self.pod_list: list[PodState] = []
        self.logs: dict[tuple[str, str], str] = {}
        self.failure: Exception | None = None
        self.deleted: list[str] = []
        """``Kind namespace/name`` (``Namespace name``) of every deletion asked, in order."""

    async def apply(self, manifests: list[Json]) -> object:
        if self.failure is not None:
            raise self.failure
        for m in manifests:
            meta = m["metadata"]
            if m["kind"] == "Service":
                m["spec"]["ports"][0]["nodePort"] = NODE_PORT
            self.stored[(m["apiVersion"], m["kind"], meta.get("namespace"), meta["name"])] = m
        return [m["metadata"]["name"] for m in manifests]

    async def delete_namespace(self, name: str) -> bool:
        self.deleted.append(f"Namespace {name}")
        gone = [k for k in self.stored if k[2] == name or (k[1], k[3]) == ("Namespace", name)]
        for key in gone:
            del self.stored[key]
        self.pod_list = [p for p in self.pod_list if p.namespace != name]
        return bool(gone)

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.deleted.append(f"{kind} {namespace}/{name}")
        return self.stored.pop((api_version, kind, namespace, name), None) is not None

    async def namespaces(self, label_selector: str) -> list[Namespace]:
        return [
            Namespace(name, m["metadata"]["labels"], m["metadata"]["annotations"], terminating=False)
            for (_, kind, _, name), m in self.stored.items()
            if kind == "Namespace"
        ]

    async def objects(
        self, api_version: str, kind: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[Json]:
        return [
            m
            for (v, k, ns, _), m in self.stored.items()
            if (v, k) == (api_version, kind) and namespace in (None, ns)
        ]

    async def pods(self, namespace: str | None, label_selector: str = "") -> list[PodState]:
        return [p for p in self.pod_list if namespace in (None, p.namespace)]

    async def pod_log_tail(
        self, namespace: str, pod: str, lines: int = 50, container: str = "", *, timestamps: bool = False
    ) -> str:
        if (namespace, pod) not in self.logs:
            raise NotFound(f"no pod {namespace}/{pod}")
        return self.logs[(namespace, pod)]

    def run_pod(self, cmd: StartWork, phase: str, state: Json, *, ready: bool = False, log: str = "") -> None:
        """Be the kubelet: the pod of ``cmd``'s controller, from its template, in ``phase``."""
        api_version, kind, ns, name = controller_of(cmd)
        template = self.stored[(api_version, kind, ns, name)]["spec"]["template"]
        pod = pod_state(
            {
                "metadata": {
                    "namespace": ns,
                    "name": f"{name}-pod",
                    "labels": template["metadata"]["labels"],
                },
                "spec": {"nodeName": "gpu-a"},
                "status": {
                    "phase": phase,
                    "startTime": "2026-11-24T14:00:00Z",
                    "containerStatuses": [
                        {"name": WORKLOAD_CONTAINER[cmd.work_kind], "state": state, "ready": ready}
                    ],
                },
            }
        )
        self.pod_list = [p for p in self.pod_list if p.name != pod.name] + [pod]
        self.logs[(pod.namespace, pod.name)] = log


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


def build(tmp_path: Path, *, refused_rounds: int = 30) -> Parts:
    cluster, now, busy = FakeCluster(), [T0], asyncio.Lock()
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
        refused_rounds=refused_rounds,
        clock=lambda: now[0],
    )
    return Parts(rounds, cluster, held, claims, now, tmp_path, busy)


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
    assert parts.cluster.stored == {} and parts.cluster.deleted == []  # nothing was applied


async def test_an_assignment_the_cluster_keeps_refusing_fails_after_the_refused_rounds(
    tmp_path: Path,
) -> None:
    parts = build(tmp_path, refused_rounds=3)
    parts.hold(job())
    parts.cluster.failure = ClusterRefused("namespace is terminating", status=403, reason="Forbidden")
    for _ in range(2):
        await parts.rounds.poll()
        assert parts.claims == [] and not parts.held[job().assignment_id].applied
    await parts.rounds.poll()
    [failed] = parts.events()
    assert isinstance(failed, JobFailed) and not failed.retryable  # the same cluster would refuse again
    assert failed.reason == "cannot start: the cluster refused its objects: namespace is terminating"
    assert parts.held == {}


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
    assert parts.cluster.deleted == [f"Namespace {namespace_of(job())}"]  # the work's last assignment


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


async def test_forgetting_deletes_an_assignments_job_and_the_namespace_with_the_works_last(
    parts: Parts,
) -> None:
    first, second = parts.hold(job(0)), parts.hold(job(1))
    await parts.rounds.poll()
    ns = namespace_of(job())
    await parts.rounds.forget(first, final=[])
    assert parts.cluster.deleted == [f"Job {ns}/{job_name(1, 0)}"]
    await parts.rounds.forget(second, final=[])
    assert parts.cluster.deleted[1:] == [f"Namespace {ns}"]
    assert parts.held == {} and parts.claims == []


async def test_forgetting_a_replica_deletes_its_deployment_and_its_service(parts: Parts) -> None:
    first, _ = parts.hold(replica(0)), parts.hold(replica(1))
    await parts.rounds.poll()
    await parts.rounds.forget(first, final=[])
    name, ns = replica_name(replica(0)), namespace_of(replica())
    assert parts.cluster.deleted == [f"Deployment {ns}/{name}", f"Service {ns}/{name}"]


async def test_nothing_is_deleted_of_what_was_never_applied(parts: Parts) -> None:
    tracked = parts.hold(job())
    await parts.rounds.forget(tracked, final=[])
    assert parts.cluster.deleted == [] and parts.held == {} and parts.stored() == {}


# --- after a restart --------------------------------------------------------------------------------


async def test_reconciling_deletes_work_no_longer_held_and_reports_lost_what_vanished(parts: Parts) -> None:
    parts.hold(job(work_id="etl-1"))
    parts.hold(job(work_id="etl-2"))
    await parts.rounds.poll()
    del parts.held[job(work_id="etl-2").assignment_id]  # the kernel stopped it while we were away
    del parts.cluster.stored[controller_of(job(work_id="etl-1"))]  # and etl-1's Job vanished
    await parts.rounds.reconcile()
    assert parts.cluster.deleted == [f"Namespace {namespace_of(job(work_id='etl-2'))}"]
    [lost] = parts.events()
    assert isinstance(lost, JobFailed) and lost.retryable
    assert lost.reason == "its objects vanished from the cluster"
    assert parts.held == {}
    await parts.rounds.reconcile()  # held by nothing now: the next reconciliation deletes it
    assert parts.cluster.deleted[1:] == [f"Namespace {namespace_of(job(work_id='etl-1'))}"]
