"""Faults of the 3-node JetStream cluster under load, with real processes everywhere.

A module-wide :class:`~ops.devstack.natscluster.NatsCluster` (R3 streams, emptied and made again
before each test); on it, per test, the kernel's services as processes (intake, coordinator,
gateway: ``python -m ops.cli ...``), two real agents heartbeating every second and running short
jobs that meter, and a client submitting jobs through the API without pause, each request with its
own ``Idempotency-Key`` and sent again with that key until it is answered. Then a node is killed
(the JOBS leader, or a follower), or every node is restarted in turn, or a coordinator is killed
mid-placement, or a gateway mid-request, and the log is replayed to check what held:

* every submission the API acknowledged is in JOBS exactly once;
* placements resume (jobs submitted after the fault are placed);
* an agent killed right after a node is still detected lost and its job placed again (epoch 2);
* the node started again catches up.

Run with ``make test-faults`` (``pytest -m faults``); ``make test`` leaves them out.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.simulated import SimulatedFleet
from core.errors import LogUnavailable
from core.log import EventLog
from core.placement.placing import work_ref
from core.streams import STREAMS, heartbeat_subject, job_subject
from ops.coordinator import Coordinator
from ops.devstack.natscluster import NatsCluster
from ops.devstack.objectstore import ObjectStoreServer
from ops.process import signal_group
from schemas.envelope import Recorded
from schemas.jobs import JobAssignmentRevoked, JobPlaced, JobResources, JobStarted, JobSubmitted
from schemas.metering import UsageTick
from schemas.workers import WorkerLost, WorkerRecovered
from tests.support import AgentProcess, of, records, registered, until, wait_records
from tests.support.cluster_stack import ClusterStack, Service, Submitter, placed_jobs, submitted_per_job, wipe

pytestmark = pytest.mark.faults

HEARTBEAT_S = "1"
"""The agents' heartbeat interval (the default): a worker silent for 3 s is lost."""
SMALL = {"cpus": 0.25, "memory_mb": 64}
"""Per shard: eight shards fit on an agent of this two-core host."""
SHORT = ["sh", "-c", "echo 'RESONTECH_PROGRESS {\"step\": 1}'; sleep 1"]
"""A job of a second or so: it starts, reports progress, is metered and completes."""
LONG = ["sh", "-c", "echo 'RESONTECH_PROGRESS {\"step\": 1}'; exec sleep 600"]
"""The job of the agent a test kills: still running when it dies."""
LOAD_AFTER_FAULT_S = 8.0
"""How long the client goes on submitting after the fault."""
SETTLE_S = 90.0
"""Deadline for what must happen after a fault (placements, a loss, catching up): generous, the
machine is shared."""


# -- the cluster, the log, the processes ---------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """Three nats-server nodes without auth, on loopback, each with its own store."""
    with NatsCluster(tmp_path_factory.mktemp("faults-cluster")) as nodes:
        yield nodes


@pytest.fixture
async def clog(cluster: NatsCluster) -> AsyncIterator[EventLog]:
    """The test's own connection to the cluster's log, on emptied R3 streams (every node running)."""
    await asyncio.to_thread(cluster.start)  # a node an earlier, failed test left down
    await wipe(cluster)
    log = await EventLog.connect(cluster.settings(ack_timeout_s=10.0), name="fault-test")
    await log.ensure_streams()
    yield log
    await log.close()


@pytest.fixture
def stack(
    cluster: NatsCluster, clog: EventLog, tmp_path: Path, object_store: ObjectStoreServer
) -> Iterator[ClusterStack]:
    kernel = ClusterStack(cluster, tmp_path, object_store)
    yield kernel
    print(f"\n-- the processes' last lines (in {tmp_path}) --\n{kernel.tails()}")
    kernel.close()


class Loaded:
    """The kernel's services, two agents and a client submitting jobs through the gateway; one agent
    (the ``victim``) runs a long job, the other (the ``survivor``) does not."""

    def __init__(self, stack: ClusterStack, log: EventLog) -> None:
        self.stack = stack
        self.log = log
        self.services: list[Service] = []
        self.agents: dict[str, AgentProcess] = {}
        self.victim = self.survivor = self.long_job = self.long_ref = ""
        self.submitter: Submitter | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Loaded:
        stack = self.stack
        self.services = [stack.intake(), stack.coordinator()]
        started = [stack.agent(name, "--heartbeat", HEARTBEAT_S) for name in ("a1", "a2")]
        self.agents = {await registered(self.log, agent): agent for agent in started}
        gateway = await stack.gateway()
        self.services.append(gateway)
        tenant, key = await stack.tenant(gateway)
        long = Submitter([gateway.url], key, tenant, self.spec(LONG), prefix="long")
        answered = await long.run_once()
        assert answered is not None, long.failed
        self.long_job = answered.job_id
        self.long_ref = f"{work_ref(tenant, 'job', self.long_job)}-"  # the head of its assignment ids
        jobs = await wait_records(self.log, "JOBS", lambda rs: of(rs, JobStarted), "the long job started")
        [started_long] = of(jobs, JobStarted)
        self.victim = started_long.worker_id
        [self.survivor] = set(self.agents) - {self.victim}
        self.submitter = Submitter([gateway.url], key, tenant, self.spec(SHORT))
        self._task = asyncio.create_task(self.submitter.run())
        await self.client.until_acked(6)
        return self

    @staticmethod
    def spec(command: list[str]) -> dict[str, object]:
        return {"kind": "process", "command": command, "resources": SMALL}

    @property
    def client(self) -> Submitter:
        assert self.submitter is not None
        return self.submitter

    async def stop_load(self) -> None:
        self.client.stop()
        assert self._task is not None
        await self._task

    def kernel_alive(self) -> None:
        dead = [s.tail() for s in self.services if not s.alive]
        assert not dead, "a kernel service died:\n" + "\n\n".join(dead)

    async def acked_exactly_once(self) -> Counter[str]:
        """Every acknowledged submission is in JOBS once; nothing is there twice, or unasked for."""
        client = self.client
        stored = await submitted_per_job(self.log)
        acked = {a.job_id for a in client.acked.values()}
        assert not acked - set(stored), f"acknowledged, not stored: {sorted(acked - set(stored))}"
        assert {job: n for job, n in stored.items() if n > 1} == {}, "stored more than once"
        asked = {client.job_id(key) for key in client.sent} | {self.long_job}
        assert set(stored) <= asked, f"stored, never asked for: {sorted(set(stored) - asked)}"
        return stored

    async def all_placed(self) -> dict[str, list[JobPlaced]]:
        """Wait until every acknowledged job has been placed."""
        acked = {a.job_id for a in self.client.acked.values()}
        deadline = time.monotonic() + SETTLE_S
        while True:
            placed = await placed_jobs(self.log)
            missing = acked - set(placed)
            if not missing:
                return placed
            assert time.monotonic() < deadline, f"{len(missing)} acknowledged jobs never placed"
            self.kernel_alive()
            await asyncio.sleep(0.5)

    def answers(self) -> str:
        """How the client fared, for the test's printout."""
        client = self.client
        slowest = max(a.acked_at - a.sent_at for a in client.acked.values())
        statuses = dict(Counter(a.status for a in client.acked.values()))
        return (
            f"{len(client.acked)} answered {statuses}, {client.failed_attempts} attempts failed "
            f"{dict(client.errors)}, slowest answer {slowest:.1f} s"
        )


async def losses(log: EventLog, since_ns: int = 0) -> list[tuple[str, str]]:
    """(worker id, ``lost``/``recovered``) of every loss and recovery stored since ``since_ns``."""
    return [
        (r.token(1), r.token(2))
        for r in await records(log, "WORKERS")
        if isinstance(r.event, WorkerLost | WorkerRecovered) and r.time_ns >= since_ns
    ]


def ended(seen: list[tuple[str, str]], worker: str) -> bool:
    """Whether every loss of ``worker`` in ``seen`` was followed by its recovery."""
    events = [event for w, event in seen if w == worker]
    return not events or events[-1] == "recovered"


async def wait_all_current(cluster: NatsCluster) -> None:
    """Every stream has its leader and two current replicas again."""
    for spec in STREAMS:
        await asyncio.to_thread(cluster.wait_stream_current, spec.name, SETTLE_S)


# -- 1, 2: kill -9 a node under load ----------------------------------------------------------------


@pytest.mark.parametrize("role", ["leader", "follower"])
async def test_kill_9_of_a_node_under_load_loses_nothing_acknowledged(
    role: str, cluster: NatsCluster, clog: EventLog, stack: ClusterStack
) -> None:
    """SIGKILL the node leading JOBS (or one that only follows it) while jobs are submitted, placed,
    run and metered; right after it, SIGKILL the agent running the long job."""
    run = await Loaded(stack, clog).start()
    leader = await asyncio.to_thread(cluster.stream_leader, "JOBS")
    node = leader if role == "leader" else (leader + 1) % 3
    killed_at, killed_ns = time.monotonic(), time.time_ns()
    await asyncio.to_thread(cluster.kill, node)
    run.agents[run.victim].kill()
    await asyncio.sleep(LOAD_AFTER_FAULT_S)
    await until(lambda: len(run.client.acked_after(killed_at)) >= 3, "answers after the kill", SETTLE_S)
    await run.stop_load()

    assert run.client.failed == {}, run.client.failed
    stored = await run.acked_exactly_once()
    placed = await run.all_placed()
    after = {a.job_id for a in run.client.acked_after(killed_at)}
    assert after and after <= set(placed)  # placements resumed

    lost_ns = (await first_loss(clog, run.victim)) - killed_ns
    jobs = await wait_records(
        clog, "JOBS", lambda rs: started_again(rs, run), "the long job started on the other agent", SETTLE_S
    )
    moves = [
        (a.worker_id, a.epoch)
        for e in of(jobs, JobPlaced)
        for a in e.assignments
        if a.assignment_id.startswith(run.long_ref)
    ]
    assert moves[:2] == [(run.victim, 1), (run.survivor, 2)], moves
    if len(moves) > 2:  # the survivor itself looked lost while heartbeats failed over: placed again
        assert "lost" in {e for w, e in await losses(clog) if w == run.survivor}, moves
        assert moves[2:] == [(run.survivor, epoch) for epoch in range(3, len(moves) + 1)], moves
    await wait_records(  # metering went on
        clog,
        "METERING",
        lambda rs: any(isinstance(r.event, UsageTick) and r.event.work_id in after for r in rs),
        "a job submitted after the kill metered",
        SETTLE_S,
    )
    run.kernel_alive()
    seen = await losses(clog)
    assert ended(seen, run.survivor), seen  # a live agent that looked silent came back
    resumed_ns = min(r.time_ns for r in jobs if isinstance(r.event, JobPlaced) and r.time_ns > killed_ns)

    began = time.monotonic()
    await asyncio.to_thread(cluster.start_node, node, SETTLE_S)
    await wait_all_current(cluster)
    names = {run.victim: "killed agent", run.survivor: "live agent"}
    print(
        f"\n{role} n{node + 1} killed: {len(stored)} jobs stored once each ({len(after)} after the kill), "
        f"{run.answers()}; first placement {(resumed_ns - killed_ns) / 1e9:.1f} s after the kill; "
        f"killed agent lost {lost_ns / 1e9:.1f} s after it; "
        f"{[(names[w], e) for w, e in seen]}; n{node + 1} back, every stream current in "
        f"{time.monotonic() - began:.1f} s"
    )


async def first_loss(log: EventLog, worker: str) -> int:
    """The store time of ``worker``'s first ``worker.lost``, once there is one."""
    found = await wait_records(
        log,
        "WORKERS",
        lambda rs: [r for r in rs if isinstance(r.event, WorkerLost) and r.token(1) == worker],
        f"{worker} lost",
        SETTLE_S,
    )
    return next(r.time_ns for r in found if isinstance(r.event, WorkerLost) and r.token(1) == worker)


def started_again(found: list[Recorded[Any]], run: Loaded) -> bool:
    """Whether the long job started again (epoch 2, or later) on the survivor."""
    return any(
        e.epoch >= 2 and e.worker_id == run.survivor and e.assignment_id.startswith(run.long_ref)
        for e in of(found, JobStarted)
    )


# -- 3: a rolling restart -----------------------------------------------------------------------------


def jobs_leader_seen_by_others(cluster: NatsCluster, node: int) -> str:
    """The JOBS leader's name as the other running nodes' monitoring (``/jsz``) tells it ("" if
    none). Not through a client connection: one to a node in lame duck mode is refused, and
    ``nats.connect`` retries a refused server for two minutes."""
    for i, other in enumerate(cluster.nodes):
        if i == node or not other.running:
            continue
        url = f"http://{other.host}:{other.monitor_port}/jsz?streams=true"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                accounts = json.load(response).get("account_details") or []
        except (OSError, ValueError):
            continue
        for stream in (s for a in accounts for s in a.get("stream_detail") or []):
            if stream.get("name") == "JOBS":
                return str((stream.get("cluster") or {}).get("leader") or "")
    return ""


def lame_duck_then_stop(cluster: NatsCluster, node: int) -> None:
    """Take ``node`` down as an operator would: lame duck mode first (SIGUSR2: it takes no new
    clients and shuts its JetStream down, so its raft groups elect leaders elsewhere), then, once
    JOBS is led elsewhere, SIGTERM, without waiting out the lame duck period (2 minutes by default,
    spent closing the clients slowly)."""
    process = cluster.nodes[node].process
    assert process is not None and process.poll() is None
    os.kill(process.pid, signal.SIGUSR2)
    name = cluster.nodes[node].name
    deadline = time.monotonic() + SETTLE_S
    while jobs_leader_seen_by_others(cluster, node) in ("", name):
        assert time.monotonic() < deadline, "JOBS was not led elsewhere"
        time.sleep(0.1)
    cluster.nodes[node].stop(30.0)


async def heartbeat_after(log: EventLog, worker: str, after_ns: int) -> None:
    """Wait until ``worker`` heartbeats after ``after_ns`` (store time)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        last = await log.get_last("HEARTBEATS", heartbeat_subject(worker))
        if last is not None and last.time_ns > after_ns:
            return
        assert time.monotonic() < deadline, f"no heartbeat of {worker} after the roll"
        await asyncio.sleep(0.2)


async def test_a_rolling_restart_of_every_node_under_load_fails_no_request(
    cluster: NatsCluster, clog: EventLog, stack: ClusterStack
) -> None:
    """Each node in turn: lame duck, SIGTERM, started again on its store, JOBS current on all three
    before the next. The client sees no request fail for good, and the agents stay registered."""
    run = await Loaded(stack, clog).start()
    rolled_from, rolled_ns = time.monotonic(), time.time_ns()
    took = []
    for node in range(3):
        began = time.monotonic()
        await asyncio.to_thread(lame_duck_then_stop, cluster, node)
        await asyncio.to_thread(cluster.start_node, node, SETTLE_S)
        await asyncio.to_thread(cluster.wait_stream_current, "JOBS", SETTLE_S)
        took.append(time.monotonic() - began)
    rolled_to_ns = time.time_ns()
    await asyncio.sleep(3.0)  # and a little load on the cluster as it is again
    await run.stop_load()

    assert run.client.failed == {}, run.client.failed
    stored = await run.acked_exactly_once()
    placed = await run.all_placed()
    during = {a.job_id for a in run.client.acked_after(rolled_from)}
    assert during and during <= set(placed)
    run.kernel_alive()
    for worker, agent in run.agents.items():  # both agents still run and heartbeat
        assert agent.proc is not None and agent.proc.poll() is None, agent.stderr()[-2000:]
        await heartbeat_after(clog, worker, rolled_to_ns)
    seen = await losses(clog, rolled_ns)
    assert not seen, f"live agents declared lost: {seen}"  # a roll is the log's silence, not theirs
    revoked = of(await records(clog, "JOBS"), JobAssignmentRevoked, reason="worker lost")
    print(
        f"\nrolling restart: the nodes took {', '.join(f'{t:.1f} s' for t in took)}; {len(stored)} jobs "
        f"stored once each ({len(during)} during or after the roll), {run.answers()}; "
        f"losses during the roll: {[(w[:8], e) for w, e in seen] or 'none'}, "
        f"{len(revoked)} assignments revoked for them"
    )


# -- 4: kill -9 a coordinator mid-placement ----------------------------------------------------------

JOBS_TO_PLACE = 300


async def submit_in_batches(log: EventLog) -> None:
    """:data:`JOBS_TO_PLACE` one-shard CPU jobs, ten every 0.1 s."""
    for start in range(0, JOBS_TO_PLACE, 10):
        batch = []
        for i in range(start, start + 10):
            event = JobSubmitted(
                name=f"j{i}",
                kind="process",
                shards=1,
                command=["true"],
                resources=JobResources(cpus=0.5, memory_mb=256),
            )
            batch.append((job_subject(f"t{i % 7}", f"j{i}", event), event, f"submit-j{i}"))
        await log.append_many(batch)
        await asyncio.sleep(0.1)


async def test_kill_9_of_one_of_two_coordinators_mid_placement_places_every_job_once(
    clog: EventLog, stack: ClusterStack
) -> None:
    """Two coordinator processes on a simulated fleet; 300 one-shard jobs arrive in batches while
    they place; one coordinator is SIGKILLed once a fifth are placed. Every job ends placed exactly
    once, with one start command per assignment."""
    fleet = SimulatedFleet(clog, 40, interval_s=3600.0, seed=11)
    await fleet.register()
    await fleet.beat()
    first, second = stack.coordinator("coordinator-1"), stack.coordinator("coordinator-2")
    await until(
        lambda: first.said("caught up; deciding") and second.said("caught up; deciding"),
        "both coordinators caught up",
        SETTLE_S,
    )
    submitting = asyncio.create_task(submit_in_batches(clog))
    deadline = time.monotonic() + SETTLE_S
    while len(at_kill := await placed_jobs(clog)) < JOBS_TO_PLACE // 5:
        assert time.monotonic() < deadline and first.alive and second.alive, stack.dead()
        await asyncio.sleep(0.05)
    first.kill()
    await submitting
    deadline = time.monotonic() + SETTLE_S
    while len(placed := await placed_jobs(clog)) < JOBS_TO_PLACE:
        assert time.monotonic() < deadline, f"{len(placed)} of {JOBS_TO_PLACE} placed; {stack.dead()}"
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # a second placement of anything would be there by now

    assert first.proc.returncode == -signal.SIGKILL and second.alive, second.tail()
    placed = await placed_jobs(clog)
    assert len(await submitted_per_job(clog)) == JOBS_TO_PLACE
    assert sorted(placed) == sorted(f"j{i}" for i in range(JOBS_TO_PLACE))
    assert {job: len(events) for job, events in placed.items() if len(events) > 1} == {}
    assignments = [a for events in placed.values() for e in events for a in e.assignments]
    per_slot = Counter((a.assignment_id.rsplit("-s", 1)[0], a.slot, a.epoch) for a in assignments)
    assert len(per_slot) == JOBS_TO_PLACE and max(per_slot.values()) == 1
    commands = Counter(r.msg_id for r in await records(clog, "COMMANDS"))
    starts = {f"start-{a.assignment_id}" for a in assignments}
    assert {c: commands[c] for c in starts if commands[c] != 1} == {}, "a start command missing or twice"
    print(
        f"\ncoordinator-1 killed with {len(at_kill)} of {JOBS_TO_PLACE} jobs placed; every job placed once, "
        f"{len(starts)} start commands, each once"
    )


# -- 5: kill -9 a gateway mid-request, and the JOBS leader with it ------------------------------------


async def until_known(url: str, key: str) -> None:
    """Wait until the gateway at ``url`` knows ``key`` (it follows the log: a new key takes a moment)."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        deadline = time.monotonic() + SETTLE_S
        while (await http.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {key}"})).status_code != 200:
            assert time.monotonic() < deadline, f"{url} never learnt the tenant's key"
            await asyncio.sleep(0.1)


async def test_kill_9_of_a_gateway_mid_request_and_of_the_jobs_leader_duplicates_nothing(
    cluster: NatsCluster, clog: EventLog, stack: ClusterStack
) -> None:
    """Two gateways on the cluster and a client given both. Once 10 submits are answered, gateway 1
    is paused (requests sent to it hang, some stored and not answered), the node leading JOBS is
    SIGKILLed, then gateway 1 too. Every submit ends answered (by gateway 2) and stored once."""
    first, second = await stack.gateway("gateway-1"), await stack.gateway("gateway-2")
    tenant, key = await stack.tenant(first)
    await until_known(second.url, key)
    spec: dict[str, object] = {"kind": "process", "command": ["true"]}
    client = Submitter([first.url, second.url], key, tenant, spec, concurrency=4, pause_s=0.05)
    submitting = asyncio.create_task(client.run())
    await client.until_acked(10)
    signal_group(first.proc.pid, signal.SIGSTOP)
    leader = await asyncio.to_thread(cluster.stream_leader, "JOBS")
    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.kill, leader)
    await asyncio.sleep(1.5)
    first.kill()
    await asyncio.sleep(LOAD_AFTER_FAULT_S)
    await until(lambda: len(client.acked_after(killed_at)) >= 10, "answers after the kills", SETTLE_S)
    client.stop()
    await submitting

    assert client.failed == {}, client.failed
    stored = await submitted_per_job(clog)
    assert {job: n for job, n in stored.items() if n > 1} == {}
    assert sorted(stored) == sorted(a.job_id for a in client.acked.values())  # nothing half-done either
    assert second.alive, second.tail()
    await asyncio.to_thread(cluster.start_node, leader, SETTLE_S)
    await wait_all_current(cluster)
    slowest = max(a.acked_at - a.sent_at for a in client.acked.values())
    print(
        f"\ngateway-1 and n{leader + 1} killed: {len(stored)} jobs stored once each; "
        f"{client.failed_attempts} attempts failed {dict(client.errors)}, slowest answer {slowest:.1f} s"
    )


# -- without a quorum: what the fixes above hold --------------------------------------------------


async def lose_quorum(cluster: NatsCluster) -> list[int]:
    """SIGKILL two nodes: no stream has a leader, nothing can be appended or read from a leader."""
    survivor = await asyncio.to_thread(cluster.stream_leader, "JOBS")
    killed = [i for i in range(3) if i != survivor]
    for i in killed:
        await asyncio.to_thread(cluster.kill, i)
    return killed


async def unavailable_in_the_end(read: Callable[[], Awaitable[object]]) -> None:
    """Call ``read`` until it raises :class:`LogUnavailable` (the node left answers as the leader for
    some 20 s, until it finds itself alone and steps down); any other error fails the test."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            await read()
        except LogUnavailable:
            return
        assert time.monotonic() < deadline, "JOBS kept a leader without a quorum"
        await asyncio.sleep(0.2)


async def test_a_read_of_a_stream_without_a_leader_is_log_unavailable(
    cluster: NatsCluster, clog: EventLog
) -> None:
    """``get_last`` and ``last_seq`` of a subject say the log is unavailable (the gateway's 503,
    which a client retries), not a bare NATS time-out (which was a 500 on a retried submit during a
    failover). (The stream's info is still answered without a leader: ``last_seq`` of a whole
    stream is.)"""
    async with await EventLog.connect(cluster.settings(ack_timeout_s=2.0), name="no-quorum") as log:
        await lose_quorum(cluster)
        subject = job_subject("acme", "j1", JobSubmitted)
        await unavailable_in_the_end(lambda: log.get_last("JOBS", subject))
        await unavailable_in_the_end(lambda: log.last_seq("JOBS", subject))
    await asyncio.to_thread(cluster.start, SETTLE_S)
    await wait_all_current(cluster)


async def test_a_coordinator_outlives_a_log_without_quorum_and_decides_again_after(
    cluster: NatsCluster, clog: EventLog
) -> None:
    """A worker falls silent while the cluster has no quorum: the coordinator's append of its
    ``worker.lost`` times out. The coordinator goes on (it used to exit on the failed append) and,
    once the nodes are back, places a job submitted then."""
    silent = SimulatedFleet(clog, 1, interval_s=2.0, seed=3, prefix="silent")
    await silent.register()
    async with await EventLog.connect(cluster.settings(ack_timeout_s=2.0), name="coordinator") as own:
        deciding = Coordinator(own, tick_s=0.1)
        stop = asyncio.Event()
        task = asyncio.create_task(deciding.run(stop))
        try:
            await until(lambda: deciding.capacity is not None, "the coordinator's first step", SETTLE_S)
            await silent.beat()  # its last: lost 6 s from now, without a quorum by then
            await lose_quorum(cluster)
            await asyncio.sleep(9.0)  # the append of its loss times out
            assert not task.done(), task.exception()
            await asyncio.to_thread(cluster.start, SETTLE_S)
            fleet = SimulatedFleet(clog, 1, interval_s=3600.0, seed=4, prefix="back")
            await fleet.register()
            await fleet.beat()
            event = JobSubmitted(name="after", kind="process", shards=1, command=["true"])
            await clog.append(job_subject("acme", "after", event), event)
            jobs = await wait_records(clog, "JOBS", lambda rs: of(rs, JobPlaced), "job.placed", SETTLE_S)
            # the silent one, once the log is back and it had its allowance to beat again (its
            # silence was not blamed on it while the heartbeat stream did not answer)
            await wait_records(clog, "WORKERS", lambda rs: of(rs, WorkerLost), "worker.lost", SETTLE_S)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
    [placed] = of(jobs, JobPlaced)
    assert placed.assignments[0].worker_id == fleet.workers[0].worker_id
    await wait_all_current(cluster)
