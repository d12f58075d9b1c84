"""The dispatcher as a service (``ops.dispatcher.service``), end to end: a real nats-server, the real
intake process and coordinator, the dispatcher with the official ``kubernetes`` client, and kmock as
the cluster (``tests/support/kube.py``: two GPU nodes). kmock runs no controllers and no containers, so the
test is the kubelet: it makes each Job's and Deployment's pod (:meth:`Kube.run_controllers`), moves
it through its phases and writes its log. Everything else is real: the kernel places, the dispatcher
applies, reads the pods and claims, the intake judges the claims and the coordinator completes,
fails and re-places.

A federated job's FL server belongs to the kernel's federation service; since no pod runs here, no
NVFlare client could reach one, so the test says what that service would (``federation_ready``, the
round and the completion of the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from core.log import EventLog
from core.streams import command_subject, endpoint_subject, job_subject
from ops.dispatcher.cluster import Cluster
from ops.dispatcher.context import RenderContext
from ops.dispatcher.fleet import CORDONED, Identity, worker_id_for
from ops.dispatcher.manifests import work_namespace
from ops.dispatcher.service import Dispatcher, Timing
from ops.dispatcher.verification import CONTAINER as VERIFY_CONTAINER
from ops.dispatcher.verification import JOB as VERIFY_JOB
from ops.dispatcher.verification import verification_namespace
from schemas.commands import StopWork
from schemas.endpoints import EndpointDeployed, EndpointReplicaReady, EndpointReplicaStarting
from schemas.jobs import (
    JobAssignmentRevoked,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobFederationReady,
    JobPlaced,
    JobProgress,
    JobResources,
    JobRoundCompleted,
    JobShardCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.metering import UsageTick
from schemas.workers import (
    WorkerPolicy,
    WorkerVerificationFailed,
    WorkerVerificationRequested,
    WorkerVerified,
)
from tests.support import REPO, IntakeProcess, coordinator, of, records, until, wait_records

if TYPE_CHECKING:
    from tests.support.kube import Kube

pytest_plugins = ("tests.support.kube",)
CLUSTER = "kc"
NODES = ("gpu-a", "gpu-b")
CTX = RenderContext()
TIMEOUT_S = 60.0  # a deadline for what the dispatcher does eventually; on a loaded machine 30 s ran out
FAST = Timing(poll_s=0.1, heartbeat_s=1.0, metering_s=0.5, nodes_s=0.3, linger_s=0.5)
"""Heartbeats a second apart: a node is lost after 3 s of silence (beats of 0.5 s missed their 1.5 s
deadline when the whole suite loaded the machine); a namespace goes half a second after its work's
last assignment."""


async def add_gpu_nodes(kube: Kube) -> None:
    for n, name in enumerate(NODES):
        await kube.add_gpu_node(name, f"10.0.0.{n + 1}")


class Running:
    """A dispatcher serving in a task of the test, with its own connection to the log."""

    def __init__(self, dispatcher: Dispatcher, task: asyncio.Task[None], stop: asyncio.Event) -> None:
        self.dispatcher, self.task, self.stop = dispatcher, task, stop

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, TIMEOUT_S)
        await self.dispatcher.log.close()
        self.dispatcher.cluster.close()


@pytest.fixture
async def intake(log: EventLog, tmp_path: Path) -> AsyncIterator[EventLog]:
    """The intake process on fresh streams."""
    # the emulated nodes' InternalIPs (add_gpu_nodes) are the network replicas are reported on
    process = IntakeProcess(tmp_path, log.settings.nats_url, replica_networks="10.0.0.0/24").start()
    try:
        yield log
    finally:
        process.stop()


@pytest.fixture
async def kernel(intake: EventLog) -> AsyncIterator[EventLog]:
    """The intake process and a coordinator on fresh streams."""
    async with coordinator(intake):
        yield intake


@pytest.fixture
async def dispatch(kube: Kube, intake: EventLog, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await dispatch()`` starts a dispatcher for the emulated cluster (state in ``tmp_path``)."""
    started: list[Running] = []

    async def start(state: str = "state", *, vouch: bool = True) -> Running:
        event_log = await EventLog.connect(intake.settings, name="dispatcher")
        cluster = Cluster.from_kubeconfig(kube.kubeconfig)
        identity = Identity(cluster=CLUSTER, provider="kube-provider")
        d = Dispatcher(cluster, event_log, identity, CTX, tmp_path / state, vouch=vouch, timing=FAST)
        stop = asyncio.Event()
        running = Running(d, asyncio.create_task(d.run(stop)), stop)
        started.append(running)
        await asyncio.wait_for(d.registered.wait(), TIMEOUT_S)
        # the dispatcher has claimed each node's registration; the kernel stores it a moment later,
        # and a job placed before would see fewer nodes than there are
        stored = {f"worker.{w}.{'verified' if vouch else 'registered'}" for w in d.fleet.registered}
        await wait_records(
            intake, "WORKERS", lambda rs: stored <= {r.subject for r in rs}, "nodes stored", TIMEOUT_S
        )
        return running

    yield start
    for running in started:
        if not running.task.done():
            with contextlib.suppress(Exception):
                await running.close()


async def kubelet(kube: Kube, stop: asyncio.Event) -> None:
    """The controllers' part: a pod for every Job and Deployment, as soon as it exists."""
    while not stop.is_set():
        await kube.run_controllers()
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def controllers(kube: Kube) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet(kube, stop))
    try:
        yield
    finally:
        stop.set()
        await task


async def job_events(
    log: EventLog, tenant: str, job_id: str, predicate: Callable[[list[Any]], Any], what: str
) -> list[Any]:
    found = await wait_records(
        log,
        "JOBS",
        lambda rs: predicate([r for r in rs if r.subject.startswith(f"job.{tenant}.{job_id}.")]),
        what,
        TIMEOUT_S,
    )
    return [r for r in found if r.subject.startswith(f"job.{tenant}.{job_id}.")]


async def placement(log: EventLog, tenant: str, job_id: str, n: int = 1) -> JobPlaced:
    """The job's ``n``-th placement, once made."""
    found = await job_events(log, tenant, job_id, lambda rs: len(of(rs, JobPlaced)) >= n, f"placement {n}")
    return of(found, JobPlaced)[n - 1]  # type: ignore[no-any-return]


def pinned(kube: Kube, ns: str, job: str) -> str:
    """The node a Job's pod is pinned to."""
    from tests.support.kube import JOBS

    return str(
        kube.mock.objects[JOBS, ns, job]["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]
    )


async def submit(log: EventLog, tenant: str, job_id: str, **fields: Any) -> None:
    fields.setdefault("resources", JobResources(gpus=1, cpus=2))
    fields.setdefault("kind", "process")
    submitted = JobSubmitted(name=job_id, command=["train.py"], **fields)
    await log.append(job_subject(tenant, job_id, submitted), submitted)


def pods_of(kube: Kube, ns: str) -> list[str]:
    from tests.support.kube import PODS

    return kube.names(PODS, ns)


async def cancel(log: EventLog, tenant: str, job_id: str, placed: JobPlaced) -> None:
    """What the gateway's ``POST .../cancel`` does: the cancellation, and a stop to each holder."""
    cancelled = JobCancelled(by=f"tenant:{tenant}", reason="enough")
    await log.append(job_subject(tenant, job_id, cancelled), cancelled)
    for a in placed.assignments:
        stop = StopWork(work_id=job_id, assignment_id=a.assignment_id, epoch=a.epoch, reason="cancelled")
        await log.append(command_subject(a.worker_id), stop, event_id=f"cancel-{a.assignment_id}")


async def pod_runs(kube: Kube, ns: str, pod: str, lines: list[str], container: str = "shard") -> None:
    await until(lambda: pod in pods_of(kube, ns), f"pod {ns}/{pod}", TIMEOUT_S)
    kube.set_log(ns, pod, "".join(line + "\n" for line in lines))
    await kube.set_pod_phase(ns, pod, "Running", container=container)


# -- a DDP job and a federated job, placed to completed ------------------------------------------


async def test_a_ddp_job_on_two_gpu_nodes_runs_to_completion_with_an_agents_events(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    from tests.support.kube import JOBS

    await add_gpu_nodes(kube)
    await dispatch()
    log, ns = kernel, work_namespace("acme", "ddp1", "job", CTX)
    image = "registry.example:5000/acme/trainer:v3"  # the tenant's own: only nodes run images
    async with controllers(kube):
        await submit(log, "acme", "ddp1", kind="ddp", shards=2, image=image)
        placed = of(await job_events(log, "acme", "ddp1", lambda rs: of(rs, JobPlaced), "placed"), JobPlaced)[
            0
        ]
        workers = {a.worker_id for a in placed.assignments}
        assert workers == {worker_id_for(CLUSTER, n) for n in NODES}  # one shard per GPU node
        await until(lambda: len(kube.names(JOBS, ns)) == 2, "both shards' Jobs", TIMEOUT_S)
        assert {pinned(kube, ns, j) for j in kube.names(JOBS, ns)} == set(NODES)
        for job in kube.names(JOBS, ns):
            [shard] = kube.mock.objects[JOBS, ns, job]["spec"]["template"]["spec"]["containers"]
            assert shard["image"] == image
        for job in kube.names(JOBS, ns):
            line = 'RESONTECH_PROGRESS {"step": 10, "loss": 0.5}'
            await pod_runs(kube, ns, f"{job}-pod", ["booting", line])
        events = await job_events(log, "acme", "ddp1", lambda rs: len(of(rs, JobProgress)) == 2, "progress")
        assert len(of(events, JobStarted)) == 2
        assert {p.loss for p in of(events, JobProgress)} == {0.5}
        for job in kube.names(JOBS, ns):
            await kube.set_pod_phase(ns, f"{job}-pod", "Succeeded", container="shard")
        events = await job_events(log, "acme", "ddp1", lambda rs: of(rs, JobCompleted), "completed")
    assert len(of(events, JobShardCompleted)) == 2 and not of(events, JobFailed)
    await until(lambda: not kube.mock.has_namespace(ns), "the namespace deleted", TIMEOUT_S)
    ticks = of(await records(log, "METERING"), UsageTick)
    assert ticks and all(t.gpu_ms > 0 and t.work_id == "ddp1" for t in ticks)


async def test_a_federated_job_runs_its_sites_as_pods_and_completes(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    from tests.support.kube import JOBS

    await add_gpu_nodes(kube)
    await dispatch()
    log, ns = kernel, work_namespace("acme", "fed1", "job", CTX)
    async with controllers(kube):
        await submit(log, "acme", "fed1", kind="federated", shards=2)
        await job_events(log, "acme", "fed1", lambda rs: of(rs, JobPlaced), "placed")
        ready = JobFederationReady(  # the federation service's word: the FL server is up
            server="fl.kernel.example:8123",
            sites=["site-1", "site-2"],
            kit_bucket="rt-kernel-kits",
            kits=["kits/acme/fed1/site-1.zip", "kits/acme/fed1/site-2.zip"],
            shards=[],
        )
        await log.append(job_subject("acme", "fed1", ready), ready)
        await until(lambda: len(kube.names(JOBS, ns)) == 2, "both sites' Jobs", TIMEOUT_S)
        for job in kube.names(JOBS, ns):
            spec = kube.mock.objects[JOBS, ns, job]["spec"]["template"]["spec"]
            argv = " ".join(spec["containers"][0]["command"] + spec["containers"][0].get("args", []))
            assert "nvflare" in argv, argv
            await pod_runs(kube, ns, f"{job}-pod", ['RESONTECH_PROGRESS {"round": 1, "loss": 0.25}'])
        await job_events(log, "acme", "fed1", lambda rs: len(of(rs, JobStarted)) == 2, "sites started")
        done = JobRoundCompleted(round=1, metrics={"loss": 0.25})
        await log.append(job_subject("acme", "fed1", done), done)
        for job in kube.names(JOBS, ns):
            await kube.set_pod_phase(ns, f"{job}-pod", "Succeeded", container="shard")
        events = await job_events(log, "acme", "fed1", lambda rs: of(rs, JobCompleted), "completed")
    assert len(of(events, JobShardCompleted)) == 2
    assert {p.round for p in of(events, JobProgress)} == {1}
    await until(lambda: not kube.mock.has_namespace(ns), "the namespace deleted", TIMEOUT_S)


# -- failures and re-placement ---------------------------------------------------------------------


async def test_a_failed_pod_fails_the_job_with_its_log_tail(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    await add_gpu_nodes(kube)
    await dispatch()
    log, ns = kernel, work_namespace("acme", "bad1", "job", CTX)
    async with controllers(kube):
        await submit(log, "acme", "bad1", shards=1)
        await job_events(log, "acme", "bad1", lambda rs: of(rs, JobPlaced), "placed")
        pod = "shard-0-e1-pod"
        await pod_runs(
            kube, ns, pod, ["loading data", "Traceback (most recent call last):", "ValueError: boom"]
        )
        await job_events(log, "acme", "bad1", lambda rs: of(rs, JobStarted), "started")
        await kube.set_pod_phase(ns, pod, "Failed", exit_code=3, container="shard")
        events = await job_events(
            log, "acme", "bad1", lambda rs: [f for f in of(rs, JobFailed) if f.assignment_id], "failed"
        )
    failed = next(f for f in of(events, JobFailed) if f.assignment_id)
    assert failed.reason == "exit status 3" and not failed.retryable
    assert "ValueError: boom" in failed.log_tail
    await until(lambda: not kube.mock.has_namespace(ns), "the namespace deleted", TIMEOUT_S)


async def test_a_node_going_not_ready_replaces_the_work_from_its_last_checkpoint(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    """The node's kubelet dies with it: its pod stays terminating, counted by the quota, and its log
    cannot be read. The replacement must still run at once, in the same namespace."""
    from tests.support.kube import JOBS

    await add_gpu_nodes(kube)
    await dispatch()
    log, ns = kernel, work_namespace("acme", "ck1", "job", CTX)
    async with controllers(kube):
        await submit(log, "acme", "ck1", shards=1)
        placed = of(await job_events(log, "acme", "ck1", lambda rs: of(rs, JobPlaced), "placed"), JobPlaced)[
            0
        ]
        first = placed.assignments[0]
        key = "jobs/ck1/checkpoints/ck1/step-100.pt"
        await pod_runs(
            kube, ns, "shard-0-e1-pod", [f'RESONTECH_CHECKPOINT {{"object_key": "{key}", "step": 100}}']
        )
        await job_events(log, "acme", "ck1", lambda rs: of(rs, JobCheckpointed), "checkpointed")
        lost_node = next(n for n in NODES if worker_id_for(CLUSTER, n) == first.worker_id)
        kube.kubelet_down(lost_node)
        await kube.set_node_ready(lost_node, "False")
        again = (await placement(log, "acme", "ck1", 2)).assignments[0]
        assert again.worker_id != first.worker_id and again.epoch == 2
        await pod_runs(kube, ns, "shard-0-e2-pod", ["resumed"])  # its pod made despite the quota
        job = kube.mock.objects[JOBS, ns, "shard-0-e2"]["spec"]["template"]["spec"]
        assert job["nodeSelector"]["kubernetes.io/hostname"] != lost_node
        env = {e["name"]: e.get("value") for e in job["containers"][0].get("env", [])}
        assert env.get("RESONTECH_RESUME_FROM") == key, env
        await until(
            lambda: "shard-0-e1" not in kube.names(JOBS, ns), "the old epoch's Job deleted", TIMEOUT_S
        )
        events = await job_events(log, "acme", "ck1", lambda rs: len(of(rs, JobStarted)) == 2, "restarted")
        assert "shard-0-e1-pod" in pods_of(kube, ns)  # still terminating on the dead node
        assert not kube.mock.terminating(ns)  # the namespace was never deleted meanwhile
    [revoked] = of(events, JobAssignmentRevoked)  # what the feed and `why` tell the tenant
    assert (revoked.assignment_id, revoked.reason) == (first.assignment_id, "worker lost")


async def test_a_kubelet_that_does_not_answer_stalls_no_other_nodes_work(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    """One node's log endpoint refuses while its pod is still Running in the API: a job on the other
    node still reports its progress and completes."""
    await add_gpu_nodes(kube)
    await dispatch()
    log = kernel
    async with controllers(kube):
        for job_id in ("slow", "fine"):
            await submit(log, "acme", job_id, shards=1)
        placed = {j: (await placement(log, "acme", j)).assignments[0] for j in ("slow", "fine")}
        assert placed["slow"].worker_id != placed["fine"].worker_id  # one GPU a node
        ns = {j: work_namespace("acme", j, "job", CTX) for j in placed}
        for j in placed:
            await pod_runs(kube, ns[j], "shard-0-e1-pod", ['RESONTECH_PROGRESS {"step": 1}'])
        await job_events(log, "acme", "slow", lambda rs: of(rs, JobProgress), "slow's first progress")
        slow_node = next(n for n in NODES if worker_id_for(CLUSTER, n) == placed["slow"].worker_id)
        kube.kubelet_down(slow_node, "hang")
        kube.set_log(
            ns["fine"], "shard-0-e1-pod", 'RESONTECH_PROGRESS {"step": 1}\nRESONTECH_PROGRESS {"step": 2}\n'
        )
        await job_events(
            log, "acme", "fine", lambda rs: [p for p in of(rs, JobProgress) if p.step == 2], "fine's progress"
        )
        await kube.set_pod_phase(ns["fine"], "shard-0-e1-pod", "Succeeded", container="shard")
        await job_events(log, "acme", "fine", lambda rs: of(rs, JobCompleted), "fine completed")


async def test_a_cordoned_node_takes_no_new_work_until_it_is_uncordoned(
    kube: Kube, intake: EventLog, dispatch: Callable[..., Any]
) -> None:
    """``kubectl cordon``: the node's worker is in maintenance (the provider's policy, which any agent
    may claim for its host), its running work untouched; ``uncordon`` lifts it."""
    await add_gpu_nodes(kube)
    await kube.cordon("gpu-a")
    log, cordoned = intake, worker_id_for(CLUSTER, "gpu-a")

    def policies(found: list[Any]) -> list[WorkerPolicy]:
        return [r.event.policy for r in found if r.subject == f"worker.{cordoned}.policy_set"]

    await dispatch()
    await wait_records(log, "WORKERS", lambda rs: policies(rs) == [CORDONED], "the cordon claimed", TIMEOUT_S)
    async with coordinator(log), controllers(kube):  # started after it: its first placement knows
        await submit(log, "acme", "one", shards=1)
        assert (await placement(log, "acme", "one")).assignments[0].worker_id == worker_id_for(
            CLUSTER, "gpu-b"
        )
        await submit(log, "acme", "two", shards=1)  # gpu-b's one GPU is taken: it waits for gpu-a
        await kube.cordon("gpu-a", on=False)
        assert (await placement(log, "acme", "two")).assignments[0].worker_id == cordoned
    assert policies(await records(log, "WORKERS")) == [CORDONED, WorkerPolicy()]


async def test_a_new_node_is_verified_by_a_job_that_runs_the_verification_program_on_it(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    """No vouching: the kernel's challenge becomes a Job pinned to the node. The test, as its kubelet,
    runs the Job's own command (the real verification program, on a CPU node here) and serves what it
    printed as the pod's log; the intake judges the claimed answer and verifies the worker."""
    from tests.support.kube import JOBS

    address = [{"type": "InternalIP", "address": "10.0.0.9"}]
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    await kube.add_node(
        "cpu-a", labels={"kubernetes.io/hostname": "cpu-a"}, allocatable=allocatable, addresses=address
    )
    log, worker = kernel, worker_id_for(CLUSTER, "cpu-a")

    def about(found: list[Any], event: type) -> list[Any]:
        return [
            r.event for r in found if r.subject.startswith(f"worker.{worker}.") and isinstance(r.event, event)
        ]

    await dispatch(vouch=False)
    found = await wait_records(
        log, "WORKERS", lambda rs: about(rs, WorkerVerificationRequested), "a challenge"
    )
    [challenge] = about(found, WorkerVerificationRequested)
    ns = verification_namespace(challenge.challenge_id, CTX)
    async with controllers(kube):
        await until(lambda: f"{VERIFY_JOB}-pod" in pods_of(kube, ns), "the verification pod", TIMEOUT_S)
        pod = kube.mock.objects[JOBS, ns, VERIFY_JOB]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": "cpu-a"}
        command = pod["containers"][0]["command"]
        ran = await asyncio.create_subprocess_exec(
            sys.executable, *command[1:], cwd=REPO, stdout=asyncio.subprocess.PIPE
        )
        printed, _ = await asyncio.wait_for(ran.communicate(), TIMEOUT_S)
        kube.set_log(ns, f"{VERIFY_JOB}-pod", printed.decode())
        await kube.set_pod_phase(ns, f"{VERIFY_JOB}-pod", "Succeeded", container=VERIFY_CONTAINER)
        found = await wait_records(log, "WORKERS", lambda rs: about(rs, WorkerVerified), "verified")
        await until(lambda: not kube.mock.has_namespace(ns), "the namespace deleted", TIMEOUT_S)
    [verified] = about(found, WorkerVerified)
    assert verified.challenge_id == challenge.challenge_id and verified.by == "intake"
    assert not about(found, WorkerVerificationFailed)


# -- teardown: cancel and restart ------------------------------------------------------------------


async def test_cancel_deletes_the_namespace(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    await add_gpu_nodes(kube)
    await dispatch()
    log, ns = kernel, work_namespace("acme", "cx1", "job", CTX)
    async with controllers(kube):
        await submit(log, "acme", "cx1", shards=2)
        placed = await placement(log, "acme", "cx1")
        await until(lambda: kube.mock.has_namespace(ns), "the namespace", TIMEOUT_S)
        await cancel(log, "acme", "cx1", placed)
        await until(lambda: not kube.mock.has_namespace(ns), "the namespace deleted", TIMEOUT_S)


async def test_a_restarted_dispatcher_leaves_no_orphan_and_reports_what_vanished(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    from tests.support.kube import JOBS

    await add_gpu_nodes(kube)
    first = await dispatch()
    log = kernel
    gone, kept = work_namespace("acme", "r1", "job", CTX), work_namespace("acme", "r2", "job", CTX)
    async with controllers(kube):
        for job_id in ("r1", "r2"):
            await submit(log, "acme", job_id, shards=1)
        await until(lambda: kube.names(JOBS, gone) and kube.names(JOBS, kept), "both jobs applied", TIMEOUT_S)
    await first.close()
    # While no dispatcher runs: r1 is cancelled, r2's Job is deleted by hand, and someone labels a
    # namespace of their own as the dispatcher's.
    await cancel(log, "acme", "r1", await placement(log, "acme", "r1"))
    by_hand = Cluster.from_kubeconfig(kube.kubeconfig)
    assert await by_hand.delete("batch/v1", "Job", kept, "shard-0-e1")
    foreign = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-x", "labels": {"app.kubernetes.io/managed-by": "resontech-dispatcher"}},
    }
    await by_hand.apply([foreign])
    by_hand.close()
    again = await dispatch()
    await until(lambda: not kube.mock.has_namespace(gone), "the cancelled job's namespace deleted", TIMEOUT_S)
    events = await job_events(
        log, "acme", "r2", lambda rs: [f for f in of(rs, JobFailed) if f.retryable], "r2 reported lost"
    )
    assert "vanished" in next(f for f in of(events, JobFailed) if f.retryable).reason
    assert kube.mock.has_namespace("team-x")  # a label alone never gets a namespace deleted
    r1 = (await placement(log, "acme", "r1")).assignments[0].assignment_id
    assert r1 not in again.dispatcher.held  # the kernel no longer assigns it: nothing is claimed for it


# -- an endpoint -----------------------------------------------------------------------------------


async def test_an_endpoint_replica_is_a_deployment_reported_ready_at_its_service(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    import kmock

    from tests.support.kube import DEPLOYMENTS, SERVICES

    SECRETS = kmock.resource("", "v1", "secrets")
    await add_gpu_nodes(kube)
    await dispatch()
    log, ns = kernel, work_namespace("acme", "chat", "endpoint", CTX)
    deployed = EndpointDeployed(name="chat", model="HuggingFaceTB/SmolLM2-135M-Instruct", min_replicas=1)
    await log.append(endpoint_subject("acme", "chat", deployed), deployed)
    async with controllers(kube):
        await until(lambda: kube.names(DEPLOYMENTS, ns), "the replica's Deployment", TIMEOUT_S)
        [name] = kube.names(DEPLOYMENTS, ns)
        await until(lambda: f"{name}-pod" in pods_of(kube, ns), "its pod", TIMEOUT_S)
        await kube.set_pod_phase(ns, f"{name}-pod", "Running", container="engine")
        found = await wait_records(
            log, "ENDPOINTS", lambda rs: of(rs, EndpointReplicaReady), "ready", TIMEOUT_S
        )
    assert of(found, EndpointReplicaStarting)
    [ready] = of(found, EndpointReplicaReady)
    service = kube.mock.objects[SERVICES, ns, name]
    assert service["spec"]["type"] == "NodePort" and service["spec"]["externalTrafficPolicy"] == "Local"
    node = kube.mock.objects[DEPLOYMENTS, ns, name]["spec"]["template"]["spec"]["nodeSelector"]
    ip = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}[node["kubernetes.io/hostname"]]
    assert ready.address == f"http://{ip}:{service['spec']['ports'][0]['nodePort']}"
    secret = kube.mock.objects[SECRETS, ns, f"{name}-key"]
    assert secret["stringData"]["api-key"] == ready.api_key


async def test_an_endpoint_of_two_replicas_runs_both_under_its_quota(
    kube: Kube, kernel: EventLog, dispatch: Callable[..., Any]
) -> None:
    """Each replica's start applies the endpoint's objects again: nothing may be created twice (a real
    API server refuses a create in a namespace whose quota is full before it sees the name is taken)."""
    from tests.support.kube import DEPLOYMENTS

    await add_gpu_nodes(kube)
    await dispatch()
    log, ns = kernel, work_namespace("acme", "duo", "endpoint", CTX)
    deployed = EndpointDeployed(
        name="duo", model="HuggingFaceTB/SmolLM2-135M-Instruct", min_replicas=2, max_replicas=2
    )
    await log.append(endpoint_subject("acme", "duo", deployed), deployed)
    async with controllers(kube):
        for n in (1, 2):  # the kernel places the second once the first is ready
            await until(
                lambda n=n: len(kube.names(DEPLOYMENTS, ns)) >= n, f"replica {n}'s Deployment", TIMEOUT_S
            )
            name = kube.names(DEPLOYMENTS, ns)[n - 1]
            await until(lambda name=name: f"{name}-pod" in pods_of(kube, ns), "its pod", TIMEOUT_S)
            await kube.set_pod_phase(ns, f"{name}-pod", "Running", container="engine")
            found = await wait_records(
                log,
                "ENDPOINTS",
                lambda rs, n=n: len(of(rs, EndpointReplicaReady)) == n,
                f"{n} ready",
                TIMEOUT_S,
            )
    assert len({r.address for r in of(found, EndpointReplicaReady)}) == 2
