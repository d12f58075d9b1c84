"""A 3-node JetStream cluster for real (:mod:`ops.devstack.natscluster`): R3 streams, appends that
outlive the node they went through, a new leader after a SIGKILL, a restarted node that catches up,
enrolled agents' users on every node, and ``resontech up --cluster 3``.

Every node is a real ``nats-server`` on loopback with ``sync_interval: always``. A stream whose
leader dies elects another after nats-server's raft election timeout, 4 to 9 s (randomised,
``server/raft.go``), which is what the deadlines below allow for.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import nats.js.errors
import pytest

from agent.enroll import enroll
from agent.heartbeat import append_reliably
from core.errors import AppendTimeout, ConcurrencyConflict, LogUnavailable, ResontechError
from core.log import EventLog, RawRecord
from core.settings import load
from core.streams import STREAMS, intake_subject, job_filter, job_subject
from gateway.app import create_app
from gateway.auth import digest
from gateway.kernel import Kernel
from gateway.settings import GatewaySettings
from ops.devstack.natscluster import NatsCluster
from ops.devstack.natsserver import NatsAuth, NatsServer
from ops.devstack.objectstore import ObjectStoreServer
from ops.services.natsauth import AgentUsersSync
from projections import PROVIDERS
from schemas.jobs import JobProgress, JobQueued, JobSubmitted
from tests.support import REPO

FAILOVER_S = 15.0
"""A killed leader's successor is elected within 9 s (the longest raft election timeout) plus a
campaign; the rest is a generous margin for a busy machine."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """An open 3-node cluster for this module; every test leaves (or gets back) all nodes running."""
    with NatsCluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(autouse=True)
def all_nodes_back(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").start()  # restarts what a test killed


@pytest.fixture
async def log(cluster: NatsCluster) -> AsyncIterator[EventLog]:
    event_log = await EventLog.connect(cluster.settings(ack_timeout_s=2.0))
    await event_log.ensure_streams()
    yield event_log
    await event_log.close()


def submitted(name: str) -> JobSubmitted:
    return JobSubmitted(name=name, kind="process", shards=1, command=["true"])


def new_job() -> str:
    return f"j-{secrets.token_hex(4)}"


def jsz(node: NatsServer, query: str = "") -> dict[str, Any]:
    """The node's own JetStream view (its monitoring endpoint), not the leader's."""
    with urllib.request.urlopen(f"http://{node.host}:{node.monitor_port}/jsz{query}", timeout=5) as response:
        found: dict[str, Any] = json.load(response)
    return found


def last_seq_on(node: NatsServer, stream: str) -> int:
    for account in jsz(node, "?streams=true").get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail["name"] == stream:
                return int(detail["state"]["last_seq"])
    raise AssertionError(f"{node.name} has no stream {stream}")


async def append_until_stored(
    log: EventLog, subject: str, event: Any, event_id: str, *, within_s: float = FAILOVER_S
) -> float:
    """Append with the same id until the cluster acknowledges it (for up to ``within_s``); the
    seconds that took."""
    started = time.monotonic()
    while True:
        try:
            await log.append(subject, event, event_id=event_id)
            return time.monotonic() - started
        except ResontechError:  # no leader yet (no responders, no acknowledgement): the same id again
            if time.monotonic() - started > within_s:
                raise
            await asyncio.sleep(0.1)


# -- the cluster -------------------------------------------------------------------------------------


def test_three_nodes_form_one_jetstream_cluster(cluster: NatsCluster) -> None:
    async def answers(url: str) -> bool:
        nc = await nats.connect(url, allow_reconnect=False)
        try:
            return (await nc.jetstream().account_info()) is not None
        finally:
            await nc.close()

    assert all(node.running for node in cluster.nodes) and len(set(cluster.urls)) == 3
    assert cluster.url == ",".join(cluster.urls)
    assert all(asyncio.run(answers(url)) for url in cluster.urls)  # JetStream on every node
    leader = cluster.meta_leader()
    for node in cluster.nodes:
        config = node.config_file.read_text()
        assert "sync_interval: always" in config and "cluster {" in config and "nats-route://route:" in config
        meta = jsz(node)["meta_cluster"]
        assert meta["cluster_size"] == 3 and meta["leader"] == cluster.nodes[leader].name


async def test_ensure_streams_makes_every_stream_three_replicas(cluster: NatsCluster, log: EventLog) -> None:
    nc = await nats.connect(cluster.urls)
    try:
        js = nc.jetstream()
        for spec in STREAMS:
            info = await js.stream_info(spec.name)
            assert info.config.num_replicas == 3, spec.name
        assert (await js.stream_info("OBJ_snapshots")).config.num_replicas == 3
    finally:
        await nc.close()
    for spec in STREAMS:
        await asyncio.to_thread(cluster.wait_stream_current, spec.name)


async def test_an_append_outlives_the_node_it_went_through(cluster: NatsCluster, log: EventLog) -> None:
    leader = await asyncio.to_thread(cluster.stream_leader, "JOBS")
    job = new_job()
    # through the leader alone: the node that took the append and the one that stored it first
    through = await EventLog.connect(cluster.settings(nats_url=cluster.urls[leader]))
    try:
        stored = await through.append(job_subject("acme", job, JobSubmitted), submitted(job))
    finally:
        await through.close()
    cluster.kill(leader)

    async def read() -> Any:
        try:
            return await log.get_last("JOBS", job_subject("acme", job, JobSubmitted))
        except (ResontechError, nats.errors.Error, TimeoutError):  # electing its next leader
            return None

    found = None
    deadline = time.monotonic() + FAILOVER_S
    while found is None and time.monotonic() < deadline:
        found = await read()
        await asyncio.sleep(0.1)
    assert found is not None and found.seq == stored.seq and found.event == submitted(job)


async def test_killing_the_jobs_leader_the_next_append_succeeds(cluster: NatsCluster, log: EventLog) -> None:
    job = new_job()
    await log.append(job_subject("acme", job, JobSubmitted), submitted(job))
    leader = await asyncio.to_thread(cluster.stream_leader, "JOBS")

    cluster.kill(leader)
    took = await append_until_stored(
        log, job_subject("acme", job, JobQueued), JobQueued(reason="x"), f"q-{job}"
    )

    assert took < FAILOVER_S
    assert await asyncio.to_thread(cluster.stream_leader, "JOBS") != leader
    stored = [r async for r in log.replay("JOBS", subjects=job_filter("acme", job))]
    assert [type(r.event) for r in stored] == [JobSubmitted, JobQueued]  # retried, stored once


async def test_a_replica_that_knows_no_leader_is_not_taken_for_the_stream(
    cluster: NatsCluster, log: EventLog
) -> None:
    """A node that knows no leader for a stream answers its info with its own store's state
    (nats-server's jsStreamInfoRequest), which may be behind what the stream acknowledged. Two of
    three nodes dead: the survivor answers so, and the log calls the stream unavailable instead of
    taking the survivor's count for its end."""
    await log.append(job_subject("acme", new_job(), JobSubmitted), submitted("x"))
    await asyncio.to_thread(cluster.wait_stream_current, "JOBS")  # the survivor knows the leader
    survivor = (await asyncio.to_thread(cluster.stream_leader, "JOBS") + 1) % 3
    for node in {0, 1, 2} - {survivor}:
        cluster.kill(node)
    raw = await nats.connect(cluster.nodes[survivor].url, **cluster.kernel_credentials)
    try:
        deadline, seen = time.monotonic() + 4 * FAILOVER_S, "nothing"
        while True:  # silent (or "temporarily unavailable") until the survivor gives up on a leader
            try:
                info = await raw.jetstream(timeout=1.0).stream_info("JOBS")
                assert info.cluster is not None
                if not info.cluster.leader:
                    break
                seen = f"leader {info.cluster.leader}"
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
                seen = type(exc).__name__
            assert time.monotonic() < deadline, f"the survivor never answered without a leader (last: {seen})"
            await asyncio.sleep(0.2)
    finally:
        await raw.close()

    try:
        answer = await log.last_seq("JOBS")
    except LogUnavailable as exc:
        assert "JOBS" in exc.message
    else:
        pytest.fail(f"last_seq answered {answer} with two of three nodes dead (on {log.connected_to})")


async def test_a_client_whose_node_answers_nothing_moves_to_another(
    cluster: NatsCluster, log: EventLog
) -> None:
    """A node that keeps its clients' connections open but answers nothing (hung, or cut off from
    the other two): a client given every URL checks the node, moves to another and appends there,
    instead of timing out until nats-py's pings give the connection up (two missed pings, 2 min
    apart). SIGSTOP makes such a node."""
    [node] = [n for n in cluster.nodes if n.url.endswith(log.connected_to)]
    assert node.process is not None
    node.process.send_signal(signal.SIGSTOP)
    try:
        job = new_job()  # no acknowledgement (the stopped node), then no leader (if it led JOBS): again
        await append_until_stored(
            log, job_subject("acme", job, JobSubmitted), submitted(job), f"s-{job}", within_s=2 * FAILOVER_S
        )
        assert not node.url.endswith(log.connected_to)
    finally:
        node.process.send_signal(signal.SIGCONT)
        await asyncio.to_thread(cluster.wait_stream_current, "JOBS")  # the next test finds it whole
    stored = [r async for r in log.replay("JOBS", subjects=job_filter("acme", job))]
    assert [r.msg_id for r in stored] == [f"s-{job}"]


async def test_a_batch_appended_while_its_stream_elects_a_leader_waits_for_it(
    cluster: NatsCluster, log: EventLog
) -> None:
    """``append_many`` waits out a leaderless stream as ``append`` does: nothing answers a publish to
    a stream between its leader's death and the next election, and that silence is not "no stream
    captures this subject" (an agent took it for a refusal and dropped its reports)."""
    leader = await asyncio.to_thread(cluster.stream_leader, "INTAKE")
    cluster.kill(leader)
    worker, items = claims(3)
    started = time.monotonic()
    attempts = 0
    while True:  # a time-out means "maybe stored": the same ids again; anything else fails the test
        attempts += 1
        try:
            positions = await log.append_many(items)
            break
        except AppendTimeout:
            assert time.monotonic() - started < FAILOVER_S, f"no leader after {attempts} attempts"

    assert await asyncio.to_thread(cluster.stream_leader, "INTAKE") != leader
    stored = await claims_of(log, worker)
    assert [r.msg_id for r in stored] == [event_id for _, _, event_id in items]  # each once, in order
    assert [r.seq for r in stored] == [p.seq for p in positions]


def claims(count: int) -> tuple[str, list[tuple[str, JobQueued, str]]]:
    """A new worker and ``count`` claims of it about a new job (subject, event, event id)."""
    job, worker = new_job(), f"w-{secrets.token_hex(4)}"
    subject = intake_subject(worker, job_subject("acme", job, JobQueued))
    return worker, [(subject, JobQueued(reason=str(n)), f"{job}-{n}") for n in range(count)]


async def claims_of(log: EventLog, worker: str) -> list[RawRecord]:
    """What ``worker`` claimed on INTAKE (a work queue nothing takes from in these tests)."""
    return [r for r in await log.replay_raw("INTAKE") if r.subject.startswith(f"intake.{worker}.")]


async def test_an_agents_report_outlives_an_election_of_the_intakes_leader(
    cluster: NatsCluster, log: EventLog
) -> None:
    """What an agent reports while INTAKE elects a leader (its ``started``, ``progress``, usage) is
    stored once the next leader answers, not given up after three quick failures."""
    leader = await asyncio.to_thread(cluster.stream_leader, "INTAKE")
    cluster.kill(leader)
    worker, reports = claims(2)

    assert await append_reliably(log, reports[:1])
    assert await append_reliably(log, reports[1:])

    assert [r.msg_id for r in await claims_of(log, worker)] == [event_id for _, _, event_id in reports]


async def test_a_restarted_node_catches_up(cluster: NatsCluster, log: EventLog) -> None:
    leader = await asyncio.to_thread(cluster.stream_leader, "JOBS")
    follower = (leader + 1) % 3
    cluster.kill(follower)
    job = new_job()
    items = [
        (job_subject("acme", job, JobQueued), JobQueued(reason=str(n)), f"{job}-{n}") for n in range(200)
    ]
    deadline = time.monotonic() + FAILOVER_S
    while True:  # a connection to the killed node moves to another first: retried with the same ids
        try:
            positions = await log.append_many(items)
            break
        except (AppendTimeout, LogUnavailable):
            if time.monotonic() > deadline:
                raise
    assert last_seq_on(cluster.nodes[leader], "JOBS") >= positions[-1].seq

    await asyncio.to_thread(cluster.start_node, follower)
    await asyncio.to_thread(cluster.wait_stream_current, "JOBS")

    # "current" is the leader's word for its raft log; the node's own store applies it a moment later
    deadline = time.monotonic() + FAILOVER_S
    while last_seq_on(cluster.nodes[follower], "JOBS") < positions[-1].seq:
        assert time.monotonic() < deadline, "the restarted node's own store did not catch up"
        await asyncio.sleep(0.2)


async def test_a_lost_race_on_a_replicated_stream_is_a_concurrency_conflict(
    cluster: NatsCluster, log: EventLog
) -> None:
    """Several appenders with the same expected sequence: one wins, every other one gets a
    :class:`ConcurrencyConflict`, as on one server. A replicated stream refuses the losers with
    error 10164 (JSStreamWrongLastSequenceConstantErr) as well as 10071."""
    appenders = [await EventLog.connect(cluster.settings(), name=f"racer-{i}") for i in range(5)]
    try:
        for round_ in range(40):
            job = new_job()
            base = await log.append(job_subject("acme", job, JobSubmitted), submitted(job))

            async def attempt(appender: EventLog, job: str = job, seq: int = base.seq) -> bool:
                try:
                    await appender.append(
                        job_subject("acme", job, JobQueued),
                        JobQueued(reason=appender.settings.nats_url),
                        expected_seq=seq,
                        expected_filter=job_filter("acme", job),
                    )
                except ConcurrencyConflict:
                    return False
                return True

            results = await asyncio.gather(*(attempt(a) for a in appenders))
            assert sum(results) == 1, f"round {round_}: {sum(results)} winners"
    finally:
        for appender in appenders:
            await appender.close()


async def _get_msg(log: EventLog, seq: int) -> Any:
    """A raw read of JOBS ``seq``, tried again while JetStream answers 503: a follower just resumed
    from SIGSTOP may cost the cluster its meta leader for a moment (seen on a loaded machine)."""
    deadline = time.monotonic() + 30.0
    while True:
        try:
            return await log._js.get_msg("JOBS", seq=seq)
        except nats.js.errors.ServiceUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_a_scan_reads_to_the_end_the_leader_named_from_a_replica_that_is_behind(
    cluster: NatsCluster, log: EventLog
) -> None:
    """A follower paused while 30,000 events are appended, then resumed: its store applies the
    backlog over the next moments, and a scan whose consumer the server places on it used to end
    where that store was (2,500 of 30,000 in one run, in 8 of 24 scans). Every scan, whole, filtered
    or from a time, now delivers everything up to the end the stream's leader named."""
    leader = await asyncio.to_thread(cluster.stream_leader, "JOBS")
    through_leader = await EventLog.connect(
        cluster.settings(nats_url=cluster.urls[leader], ack_timeout_s=30.0)
    )
    try:
        for round_, follower in enumerate(i for i in range(3) if i != leader):
            before = await through_leader.last_seq("JOBS")
            pid = cluster.nodes[follower].pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                await through_leader.append_many(
                    (job_subject("acme", f"lag{round_}-{i % 3}", JobProgress), JobProgress(epoch=1, step=i))
                    for i in range(30_000)
                )
            finally:
                os.kill(pid, signal.SIGCONT)
            end = await through_leader.last_seq("JOBS")
            since = (await _get_msg(through_leader, before + 10_001)).time

            async def count(**bounds: Any) -> int:
                return sum([1 async for _ in through_leader.replay("JOBS", **bounds)])

            counts = await asyncio.gather(
                *(count() for _ in range(3)),
                *(count(subjects=f"job.acme.lag{round_}-1.>") for _ in range(2)),
                count(start_time=since),
            )
            assert counts == [end] * 3 + [10_000] * 2 + [20_000], f"round {round_}: {counts}"
    finally:
        await through_leader.close()


# -- enrolled agents' users, on every node -----------------------------------------------------------


@pytest.fixture
def secured_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path / "nats", auth=NatsAuth(kernel_password=secrets.token_urlsafe(24))) as running:
        yield running


async def accepted(url: str, user: str, password: str) -> bool:
    try:
        nc = await nats.connect(url, user=user, password=password, allow_reconnect=False, connect_timeout=3)
    except (nats.errors.Error, OSError, TimeoutError):
        return False
    await nc.close()
    return True


async def test_an_enrolled_agent_is_accepted_by_every_node_once_its_nats_auth_synced(
    secured_cluster: NatsCluster, object_store: ObjectStoreServer, tmp_path: Path
) -> None:
    cluster = secured_cluster
    settings = cluster.settings(
        s3_endpoint=object_store.endpoint,
        s3_access_key=object_store.access_key,
        s3_secret_key=object_store.secret_key,
    )
    async with await EventLog.connect(settings) as event_log:
        await event_log.ensure_streams()
    operator_key = "rt_operator0000_" + secrets.token_urlsafe(32)
    gateway = GatewaySettings(operator_key_sha256=digest(operator_key))
    kernel = Kernel(settings, gateway)
    await kernel.start()
    stop = asyncio.Event()
    syncs: list[AgentUsersSync] = []
    tasks: list[asyncio.Task[None]] = []
    logs: list[EventLog] = []

    async def run_sync(i: int) -> AgentUsersSync:
        node = cluster.nodes[i]
        assert node.agents_file is not None
        logs.append(await EventLog.connect(settings, name=f"test-nats-auth-{i}"))
        sync = AgentUsersSync(logs[-1], node.agents_file, node.reload)  # reloads its own node only
        tasks.append(asyncio.create_task(sync.run(stop)))
        await asyncio.wait_for(sync.first_synced.wait(), 30)
        syncs.append(sync)
        return sync

    try:
        for i in (0, 1):  # node 3's nats-auth is not running yet
            await run_sync(i)
        app = create_app(settings, gateway, kernel=kernel)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
            enrolled = await enroll_one(client, operator_key, tmp_path / "agent")
        seq = kernel.runners[PROVIDERS.name].seq
        for sync in syncs:
            await sync.wait_synced(seq, timeout=30)
        user, password = enrolled.nats.user, enrolled.nats.password
        assert enrolled.nats.url == cluster.url  # the agent is told every node

        assert await accepted(cluster.urls[0], user, password)
        assert await accepted(cluster.urls[1], user, password)
        assert not await accepted(cluster.urls[2], user, password)  # its agents file lacks the user
        assert not await accepted(cluster.urls[0], user, "not-the-password")

        third = await run_sync(2)
        await third.wait_synced(seq, timeout=30)
        assert await accepted(cluster.urls[2], user, password)
        files = [node.agents_file.read_text() for node in cluster.nodes if node.agents_file]
        assert len(files) == 3 and len(set(files)) == 1 and user in files[0]
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
        for own in logs:
            await own.close()
        await kernel.stop()


async def enroll_one(client: httpx.AsyncClient, operator_key: str, state_dir: Path) -> Any:
    """A provider, an enrollment token, and an agent enrolled with it through ``client``."""
    operator = {"Authorization": f"Bearer {operator_key}"}
    provider = f"p-{secrets.token_hex(3)}"
    created = await client.post(
        "/v1/providers", json={"provider": provider, "display_name": "GPU Co"}, headers=operator
    )
    assert created.status_code == 201, created.text
    key = created.json()["api_key"]["key"]
    issued = await client.post(
        f"/v1/providers/{provider}/enrollment-tokens",
        json={"region": "eu-north"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert issued.status_code == 201, issued.text
    return await enroll(client, issued.json()["token"], state_dir)


# -- resontech up --cluster 3 ------------------------------------------------------------------------


def stack_state(data_dir: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((data_dir / "stack.json").read_text())
    except (OSError, ValueError):
        return {}
    return state


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_up_cluster_runs_three_nodes_and_two_of_each_service(tmp_path: Path) -> None:
    data_dir, out = tmp_path / "stack", tmp_path / "up.out"
    with out.open("wb") as sink:
        argv = ["up", "--data-dir", str(data_dir), "--cluster", "3"]
        argv += ["--nats-port", "0", "--s3-port", "0", "--gateway-port", "0"]  # free ports
        proc = subprocess.Popen(
            [sys.executable, "-m", "ops.devstack", *argv],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while not stack_state(data_dir).get("ready") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, out.read_text()
        names = {p["name"]: p["pid"] for p in stack_state(data_dir)["processes"]}
        expected = {"nats-1", "nats-2", "nats-3", "nats-auth-1", "nats-auth-2", "nats-auth-3"}
        doubled = ("gateway", "coordinator", "projector", "intake", "federation")
        expected |= {f"{service}-{n}" for service in doubled for n in (1, 2)}
        assert expected | {"object store", "agent-1", "agent-2"} == set(names)
        settings = load(env={}, env_file=data_dir / "dev.env")
        assert settings.stream_replicas == 3 and len(settings.nats_url.split(",")) == 3
        gateways = (data_dir / "dev.env").read_text().split("RESONTECH_GATEWAY_URL=")[1].split()[0].split(",")
        assert len(gateways) == 2
        text = out.read_text()
        assert all(url in text for url in [*settings.nats_url.split(","), *gateways])
        health = [httpx.get(f"{url}/v1/health").status_code for url in gateways]
        assert health == [200, 200]  # "ready" means it

        operator_key = (data_dir / "operator.key").read_text().strip()
        job = asyncio.run(submit_and_finish(gateways, operator_key))
        assert job["state"] == "completed", job

        alive = {name for name, pid in names.items() if not gone(pid)}
        assert alive == set(names), f"exited: {set(names) - alive}; see {data_dir / 'logs'}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, out.read_text()
    assert all(gone(pid) for pid in names.values())
    assert not (data_dir / "stack.json").exists()


async def submit_and_finish(gateways: list[str], operator_key: str) -> dict[str, Any]:
    """A job submitted through the second gateway, followed through the first until it ends."""
    first, second = gateways
    async with httpx.AsyncClient(timeout=30) as client:
        created = await client.post(
            f"{second}/v1/tenants",
            json={"tenant": "acme", "display_name": "acme"},
            headers={"Authorization": f"Bearer {operator_key}"},
        )
        assert created.status_code == 201, created.text
        admin = {"Authorization": f"Bearer {created.json()['admin_key']['key']}"}
        body = {
            "name": "hello",
            "kind": "process",
            "shards": 2,
            "command": [sys.executable, "-c", "print(1)"],
        }
        submitted = await client.post(f"{second}/v1/jobs", json=body, headers=admin)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["job_id"]
        job: dict[str, Any] = {}

        async def ended() -> bool:
            nonlocal job
            job = (await client.get(f"{first}/v1/jobs/{job_id}", headers=admin)).json()
            return job.get("state") in ("completed", "failed", "cancelled")

        deadline = time.monotonic() + 120  # the agents' verification jobs first: a CPU benchmark
        while not await ended() and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        return job
