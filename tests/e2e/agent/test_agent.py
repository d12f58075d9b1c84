"""The worker agent end to end: real ``resontech agent`` processes against a real nats-server.

Each test starts its agents with a unique name and state dir under ``tmp_path``, a 0.2 s heartbeat
and 0.5 s metering, and stops them in teardown (SIGTERM, then SIGKILL, then any workload they left).
There is no GPU here: NVML is missing, so every agent reports zero GPUs and runs CPU work.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import nats
import pytest

from agent.devices import NO_NVML_MESSAGE
from agent.runtimes.process import cgroup_name
from agent.simulated import SimulatedFleet
from core.cgroups import detect
from core.log import EventLog
from core.pricing import gpu_family
from core.settings import Settings
from ops.devstack.natsserver import NatsServer
from schemas.commands import StopWork
from schemas.jobs import (
    JobCheckpointed,
    JobFailed,
    JobPlaced,
    JobProgress,
    JobRejected,
    JobShardCompleted,
    JobStarted,
    JobSubmitted,
)
from schemas.metering import UsageTick
from schemas.workers import Heartbeat, WorkerPolicySet, WorkerRegistered
from tests.support import (
    REPO,
    AgentProcess,
    IntakeProcess,
    of,
    records,
    registered,
    until,
    wait_records,
)
from tests.support.work import py, send, start_work

# -- registration and heartbeats -------------------------------------------------------------------


async def test_registers_with_a_stable_id_and_heartbeats_without_nvml(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents("reg")
    worker_id = await registered(log, agent)
    assert worker_id.startswith("w-") and len(worker_id) == 14
    await wait_records(log, "HEARTBEATS", lambda rs: len(rs) >= 10, "10 heartbeats")
    beats = await records(log, "HEARTBEATS", f"hb.{worker_id}")
    gaps = [(b.time_ns - a.time_ns) / 1e9 for a, b in itertools.pairwise(beats)]
    assert 0.15 <= statistics.median(gaps) <= 0.3, gaps
    beat: Heartbeat = beats[-1].event
    assert (beat.interval_s, beat.gpus, beat.running) == (0.2, [], [])
    assert beat.memory_used_mb > 0 and 0.0 <= beat.cpu_pct <= 100.0

    [registration] = of(await records(log, "WORKERS"), WorkerRegistered)
    assert registration.gpus == [] and registration.driver == ""
    assert registration.cpus >= 1 and registration.memory_mb > 0
    assert (registration.pool, registration.provider) == ("shared", "local")
    assert NO_NVML_MESSAGE in agent.stderr()
    assert "Traceback" not in agent.stderr()

    assert agent.stop() == 0
    again = agents("reg")  # the same name and state dir: a restart
    assert await again.worker_id() == worker_id
    await wait_records(log, "WORKERS", lambda rs: len(of(rs, WorkerRegistered)) == 2, "re-registration")
    subjects = {r.subject for r in await records(log, "WORKERS")}
    assert subjects == {
        f"worker.{worker_id}.{e}" for e in ("registered", "verification_requested", "verified")
    }


# -- running work ----------------------------------------------------------------------------------

PROGRESS_AND_EXIT = """
import os, time
leaked = any(k.startswith(("RESONTECH_NATS", "RESONTECH_S3")) for k in os.environ)
print('hello from the workload')
print('RESONTECH_PROGRESS {"round": 1, "loss": 0.5, "step": 10, "metrics": {"leaked": %d}}' % leaked)
time.sleep(1.3)
"""


async def test_start_work_runs_reports_progress_completes_and_meters(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents("run")
    worker_id = await registered(log, agent)
    await send(log, worker_id, start_work(py(PROGRESS_AND_EXIT), tier="gold"))

    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobShardCompleted), "job.shard_completed")
    jobs = [r for r in jobs if not isinstance(r.event, JobSubmitted | JobPlaced)]  # the kernel's, by hand
    assert [type(r.event) for r in jobs] == [JobStarted, JobProgress, JobShardCompleted]
    assert jobs[0].event == JobStarted(assignment_id="j1-s0-e1", worker_id=worker_id, slot=0, epoch=1)
    progress: JobProgress = jobs[1].event
    assert (progress.epoch, progress.slot, progress.round, progress.loss, progress.step) == (1, 0, 1, 0.5, 10)
    assert progress.metrics == {"leaked": 0.0}  # the agent's NATS settings never reach the workload

    ticks: list[UsageTick] = of(await records(log, "METERING"), UsageTick)
    assert len(ticks) >= 3  # two intervals of 0.5 s and the final partial one
    assert all(t.cpu_ms > 0 and t.gpu_ms == 0 and t.gpu_type == "cpu" for t in ticks)
    # who is paid and at which tier are the kernel's facts, not the spec's "gold": a new worker is
    # unverified for its first day (and paid nothing)
    assert all((t.tier, t.pool, t.provider, t.epoch) == ("unverified", "shared", "local", 1) for t in ticks)
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(ticks))  # contiguous
    assert 1200 <= ticks[-1].end_ms - ticks[0].start_ms <= 4000
    log_txt = (agent.work_dir / "j1-s0-e1" / "log.txt").read_text()
    assert "hello from the workload" in log_txt


async def test_failing_command_reports_failed_with_the_log_tail(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    worker_id = await registered(log, agents("fail"))
    code = "import sys; print('step 1'); print('boom: out of memory', file=sys.stderr); sys.exit(3)"
    await send(log, worker_id, start_work(py(code), epoch=4, slot=2))
    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobFailed), "job.failed")
    [failed] = of(jobs, JobFailed)
    assert (failed.reason, failed.epoch, failed.slot, failed.retryable) == ("exit status 3", 4, 2, False)
    assert "step 1" in failed.log_tail and "boom: out of memory" in failed.log_tail
    assert not of(jobs, JobShardCompleted)


async def test_stale_epoch_and_duplicate_commands_are_not_run(
    log: EventLog, agents: Callable[..., AgentProcess], settings: Settings, tmp_path: Path
) -> None:
    agent = agents("fence")
    worker_id = await registered(log, agent)
    touch = py("open('runs.txt', 'a').write('run\\n')")  # in its own directory: the only one it may write
    await send(log, worker_id, start_work(touch, assignment_id="j1-e2", epoch=2), event_id="cmd-a")
    await wait_records(log, "JOBS", lambda rs: of(rs, JobShardCompleted), "the first run")

    # An older epoch of the same work: dropped, not started.
    await send(log, worker_id, start_work(touch, assignment_id="j1-e1", epoch=1), event_id="cmd-stale")
    # The same command id again, past the server's duplicate window (shortened here), so that the
    # work queue really delivers it twice: the agent's own memory of handled ids must catch it.
    await shorten_duplicate_window(settings.nats_url)
    await asyncio.sleep(1.2)
    await send(log, worker_id, start_work(touch, assignment_id="j1-e2", epoch=2), event_id="cmd-a")
    # A sentinel: commands are handled in order, so once it started the others were handled.
    await send(log, worker_id, start_work(py("pass"), work_id="j2", assignment_id="j2-e1"), event_id="cmd-b")
    jobs = await wait_records(
        log, "JOBS", lambda rs: any(r.subject.startswith("job.acme.j2.started") for r in rs), "the sentinel"
    )
    started = [e.assignment_id for e in of(jobs, JobStarted)]
    assert started == ["j1-e2", "j2-e1"]
    work = agent.work_dir
    assert (work / "j1-e2" / "runs.txt").read_text() == "run\n" and not (work / "j1-e1").exists()


async def shorten_duplicate_window(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("COMMANDS")
        info.config.duplicate_window = 1.0
        await js.update_stream(info.config)
    finally:
        await nc.close()


async def test_policy_rejects_a_tenant_with_the_reason(
    log: EventLog, agents: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("allowed_tenants: [acme]\nmax_concurrent: 4\n")
    worker_id = await registered(log, agents("policy", "--policy", str(policy)))
    [policy_set] = of(await records(log, "WORKERS"), WorkerPolicySet)
    assert policy_set.policy.allowed_tenants == ["acme"] and policy_set.policy.max_concurrent == 4

    await send(log, worker_id, start_work(py("pass"), tenant="globex"))
    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobRejected), "job.rejected")
    assert of(jobs, JobRejected) == [
        JobRejected(
            assignment_id="j1-s0-e1",
            worker_id=worker_id,
            epoch=1,
            reason="tenant globex not allowed by provider policy",
        )
    ]
    assert [r.subject for r in jobs if isinstance(r.event, JobRejected)] == ["job.globex.j1.rejected"]
    assert not of(jobs, JobStarted)


def pid_of(agent: AgentProcess, assignment_id: str) -> int:
    return int((agent.work_dir / assignment_id / "pid").read_text())


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_stop_work_cancels_a_running_sleep(log: EventLog, agents: Callable[..., AgentProcess]) -> None:
    agent = agents("stop")
    worker_id = await registered(log, agent)
    await send(log, worker_id, start_work(["sleep", "60"]))
    await wait_records(log, "JOBS", lambda rs: of(rs, JobStarted), "job.started")
    pid = await until(lambda: (agent.work_dir / "j1-s0-e1/pid").exists() and pid_of(agent, "j1-s0-e1"), "pid")
    assert alive(pid)
    await wait_records(
        log, "HEARTBEATS", lambda rs: any(r.event.running == ["j1-s0-e1"] for r in rs), "a beat with it"
    )

    stopped_at = time.monotonic()
    await send(log, worker_id, StopWork(work_id="j1", assignment_id="j1-s0-e1", epoch=1, reason="revoked"))
    await until(lambda: not alive(pid), "the workload is gone", timeout=10)
    assert time.monotonic() - stopped_at < 5
    await wait_records(
        log, "HEARTBEATS", lambda rs: rs[-1].event.running == [], "a heartbeat with nothing running"
    )
    jobs = await records(log, "JOBS")
    assert not of(jobs, JobFailed) and not of(jobs, JobShardCompleted)  # a requested stop is not a failure
    await wait_records(log, "METERING", lambda rs: rs, "usage ticks")
    ticks: list[UsageTick] = of(await records(log, "METERING"), UsageTick)
    assert ticks[-1].end_ms - ticks[0].start_ms < 8000  # billing stopped at the stop


CHECKPOINT_ON_SIGTERM = """
import signal, sys, time
def on_term(*_):
    print('RESONTECH_CHECKPOINT {"object_key": "jobs/j1/checkpoints/j1/step-7.pt", "round": 2, "step": 7}')
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print('ready')
time.sleep(60)
"""


async def test_stop_with_checkpoint_lets_the_workload_checkpoint(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents("preempt")
    worker_id = await registered(log, agent)
    await send(log, worker_id, start_work(py(CHECKPOINT_ON_SIGTERM)))
    log_txt = agent.work_dir / "j1-s0-e1" / "log.txt"
    await until(lambda: log_txt.exists() and "ready" in log_txt.read_text(), "the workload is ready")
    await send(
        log,
        worker_id,
        StopWork(work_id="j1", assignment_id="j1-s0-e1", epoch=1, reason="preempted", checkpoint=True),
    )
    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobCheckpointed), "job.checkpointed")
    assert of(jobs, JobCheckpointed) == [
        JobCheckpointed(
            epoch=1,
            object_key="jobs/j1/checkpoints/j1/step-7.pt",
            round=2,
            slot=0,
            step=7,
            assignment_id="j1-s0-e1",
        )
    ]


SLOW_CHECKPOINT_ON_SIGTERM = """
import signal, sys, time
def on_term(*_):
    time.sleep(1.0)  # writing the checkpoint takes a while
    print('RESONTECH_CHECKPOINT {"object_key": "jobs/j1/checkpoints/j1/last.pt"}')
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print('ready')
time.sleep(60)
"""


async def test_work_placed_in_place_of_a_preempted_assignment_waits_for_its_checkpoint(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    # One GPU: the kernel revokes j1 (preempted) and places j2 on the GPU it frees; the agent gets
    # StopWork(checkpoint) then StartWork. j2 must start once j1 has checkpointed, not be refused.
    agent = agents("handover", "--devices", "simulated", env={"RESONTECH_AGENT_SIMULATED_GPUS": "1"})
    worker_id = await registered(log, agent)
    await send(log, worker_id, start_work(py(SLOW_CHECKPOINT_ON_SIGTERM), gpus=1))
    log_txt = agent.work_dir / "j1-s0-e1" / "log.txt"
    await until(lambda: log_txt.exists() and "ready" in log_txt.read_text(), "j1 is ready")
    stop = StopWork(work_id="j1", assignment_id="j1-s0-e1", epoch=1, reason="preempted", checkpoint=True)
    await send(log, worker_id, stop)
    await send(log, worker_id, start_work(["sleep", "60"], work_id="j2", assignment_id="j2-s0-e1", gpus=1))
    jobs = await wait_records(
        log, "JOBS", lambda rs: of(rs, JobStarted, assignment_id="j2-s0-e1") or of(rs, JobRejected), "j2"
    )
    assert not of(jobs, JobRejected)
    assert [e.object_key for e in of(jobs, JobCheckpointed)] == ["jobs/j1/checkpoints/j1/last.pt"]
    assert not of(jobs, JobFailed)  # a requested stop is not a failure


async def test_agent_stop_and_crash_report_running_work_failed_retryable(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents("crash")
    worker_id = await registered(log, agent)
    await send(log, worker_id, start_work(["sleep", "60"], work_id="j1", assignment_id="j1-a"))
    await wait_records(log, "JOBS", lambda rs: of(rs, JobStarted), "job.started")
    pid = await until(lambda: (agent.work_dir / "j1-a/pid").exists() and pid_of(agent, "j1-a"), "pid")

    agent.kill()  # SIGKILL: the agent cannot clean up, but its workloads die with it (never unwatched)
    await until(lambda: not alive(pid), "the workload dies with its agent", timeout=5)
    cgroups = detect()
    left = (
        [p / f"resontech-{cgroup_name(agent.work_dir / 'j1-a')}" for p in cgroups.parents] if cgroups else []
    )
    assert all(d.is_dir() for d in left)  # the dead agent's cgroup for it is still there
    agents("crash")
    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobFailed), "failure after restart")
    assert of(jobs, JobFailed) == [
        JobFailed(reason="agent restarted", epoch=1, slot=0, retryable=True, assignment_id="j1-a")
    ]
    assert not any(d.exists() for d in left)  # the next run removed it


async def test_agent_sigterm_stops_workloads_and_reports_them_retryable(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents("term")
    worker_id = await registered(log, agent)
    await send(log, worker_id, start_work(["sleep", "60"], work_id="j1", assignment_id="j1-b"))
    await wait_records(log, "JOBS", lambda rs: of(rs, JobStarted), "job.started")
    pid = await until(lambda: (agent.work_dir / "j1-b/pid").exists() and pid_of(agent, "j1-b"), "pid")
    assert agent.stop() == 0
    assert not alive(pid)
    [failed] = of(await records(log, "JOBS"), JobFailed)
    assert (failed.reason, failed.retryable) == ("agent stopped", True)


# -- bad configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file_name", "text"),
    [
        ("policy.yaml", "allowed_tenants: [acme\n"),
        ("policy.yaml", "allowed_tenant: [acme]\n"),
        ("policy.toml", "max_vram_fraction = 1.5\n"),
    ],
)
def test_malformed_policy_stops_the_agent_with_one_line(
    tmp_path: Path, settings: Settings, file_name: str, text: str
) -> None:
    policy = tmp_path / file_name
    policy.write_text(text)
    agent = AgentProcess("bad", tmp_path, settings.nats_url, "--policy", str(policy))
    done = subprocess.run(agent.argv(), cwd=REPO, env=agent.env, capture_output=True, timeout=30)
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: policy file ") and str(policy) in lines[0]


def test_bad_agent_setting_stops_the_agent_with_one_line(tmp_path: Path, settings: Settings) -> None:
    agent = AgentProcess("bad", tmp_path, settings.nats_url)
    agent.env["RESONTECH_AGENT_METERING_INTERVAL_S"] = "often"
    done = subprocess.run(agent.argv(), cwd=REPO, env=agent.env, capture_output=True, timeout=30)
    assert done.returncode != 0
    assert done.stderr.decode().strip().splitlines() == [
        "error: RESONTECH_AGENT_METERING_INTERVAL_S='often' is not a valid float"
    ]


# -- simulated fleet (load tests only) -------------------------------------------------------------


async def test_simulated_fleet_registers_and_heartbeats_in_batches(log: EventLog) -> None:
    fleet = SimulatedFleet(log, 300, interval_s=0.2, seed=7)
    await fleet.register()
    await fleet.beat()
    await fleet.beat()
    workers = of(await records(log, "WORKERS"), WorkerRegistered)
    assert len(workers) == 300 and fleet.beats_sent == 600 and fleet.beats_failed == 0
    models = {gpu_family(g.model) for w in workers for g in w.gpus}
    assert {"A100", "H100", "RTX4090"} <= models
    assert len({w.region for w in workers}) > 1 and any(not w.gpus for w in workers)
    assert len(await records(log, "HEARTBEATS")) == 600
    again = SimulatedFleet(log, 300, interval_s=0.2, seed=7)  # same seed, same fleet
    assert [w.registration for w in again.workers] == [w.registration for w in fleet.workers]


async def test_simulated_fleet_answers_commands_when_asked(log: EventLog) -> None:
    fleet = SimulatedFleet(log, 3, interval_s=0.2, accept_commands=True, complete_after_s=0.3)
    stop = asyncio.Event()
    run = asyncio.create_task(fleet.run(stop))
    try:
        await wait_records(log, "WORKERS", lambda rs: len(of(rs, WorkerRegistered)) == 3, "registrations")
        worker_id = fleet.workers[1].worker_id
        await send(log, worker_id, start_work(["train"], work_id="j9", assignment_id="j9-a"))
        jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobShardCompleted), "a simulated completion")
        assert of(jobs, JobStarted) == [
            JobStarted(assignment_id="j9-a", worker_id=worker_id, slot=0, epoch=1)
        ]
    finally:
        stop.set()
        await run


async def test_agent_simulate_flag_hosts_a_fleet(log: EventLog, agents: Callable[..., AgentProcess]) -> None:
    fleet = agents("fleet", "--simulate", "25")
    await wait_records(
        log, "WORKERS", lambda rs: len(of(rs, WorkerRegistered)) == 25, "25 simulated registrations"
    )
    await wait_records(log, "HEARTBEATS", lambda rs: len(rs) >= 50, "two rounds of heartbeats")
    assert fleet.stop() == 0


async def test_agent_survives_a_server_restart_and_still_takes_commands(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "store", log_file=tmp_path / "nats.log")
    server.start()
    settings = Settings(nats_url=server.url, ack_timeout_s=2.0)
    agent = AgentProcess("reconnect", tmp_path, server.url)
    intake = IntakeProcess(tmp_path, server.url)
    log = None
    try:
        log = await EventLog.connect(settings)
        await log.ensure_streams()
        intake.start()
        agent.enroll(settings)
        agent.start()
        worker_id = await registered(log, agent)
        await log.close()
        server.kill()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(server.restart)
        log = await EventLog.connect(Settings(nats_url=server.url, ack_timeout_s=2.0))
        after = await log.last_seq("HEARTBEATS")
        await send(log, worker_id, start_work(py("pass")))
        await wait_records(log, "JOBS", lambda rs: of(rs, JobShardCompleted), "the job run after the restart")
        await wait_records(log, "HEARTBEATS", lambda rs: rs and rs[-1].seq > after, "heartbeats again")
        assert agent.proc is not None and agent.proc.poll() is None
        assert "Traceback" not in agent.stderr()
    finally:
        if log is not None:
            await log.close()
        agent.cleanup()
        intake.stop()
        server.stop()


async def test_a_newer_epoch_of_the_same_slot_supersedes_the_running_one(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents("supersede")
    worker_id = await registered(log, agent)
    await send(log, worker_id, start_work(["sleep", "60"], assignment_id="j1-e1", epoch=1))
    await wait_records(log, "JOBS", lambda rs: of(rs, JobStarted), "the first epoch started")
    old = await until(lambda: (agent.work_dir / "j1-e1/pid").exists() and pid_of(agent, "j1-e1"), "pid")
    await send(log, worker_id, start_work(py("pass"), assignment_id="j1-e2", epoch=2))
    jobs = await wait_records(log, "JOBS", lambda rs: of(rs, JobShardCompleted), "the second epoch completed")
    await until(lambda: not alive(old), "the superseded workload is gone", timeout=5)
    assert [e.assignment_id for e in of(jobs, JobStarted)] == ["j1-e1", "j1-e2"]
    assert not of(jobs, JobFailed)  # superseded work is not a failure


async def test_a_stop_of_an_older_epoch_still_running_here_is_not_stale(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    # Slot 0 of j1 was re-placed at epoch 2 onto the agent that runs slot 1 at epoch 1 (a federated
    # job after a lost worker): stopping slot 1 must still stop it.
    agent = agents("mixed")
    worker_id = await registered(log, agent)
    await send(log, worker_id, start_work(["sleep", "60"], assignment_id="j1-s1-e1", slot=1, epoch=1))
    await send(log, worker_id, start_work(["sleep", "60"], assignment_id="j1-s0-e2", slot=0, epoch=2))
    await wait_records(log, "JOBS", lambda rs: len(of(rs, JobStarted)) == 2, "both started")
    older = await until(
        lambda: (agent.work_dir / "j1-s1-e1/pid").exists() and pid_of(agent, "j1-s1-e1"), "its pid"
    )
    await send(log, worker_id, StopWork(work_id="j1", assignment_id="j1-s1-e1", epoch=1, reason="job ended"))
    await until(lambda: not alive(older), "slot 1 stopped", timeout=10)
    assert alive(pid_of(agent, "j1-s0-e2"))
    # A start of that older epoch is still stale.
    await send(log, worker_id, start_work(["sleep", "60"], assignment_id="j1-s1-e1b", slot=1, epoch=1))
    await until(lambda: "dropped stale command" in agent.stderr(), "the late start dropped")


class StallingServer:
    """An HTTP server on loopback that answers a GET with headers and one byte of a large body, then
    nothing: a download that takes forever. ``closed`` is set when the client hangs up."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> StallingServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/shard.zip"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\nx")
        await writer.drain()
        await reader.read()  # until the client closes the connection
        self.closed.set()
        writer.close()


async def test_a_slow_download_holds_up_no_other_command_and_a_stop_drops_it(
    log: EventLog, agents: Callable[..., AgentProcess]
) -> None:
    agent = agents("fetching")
    worker_id = await registered(log, agent)
    async with StallingServer() as stalling:
        slow = start_work(["true"], work_id="big", assignment_id="big-s0-e1")
        slow = msgspec.structs.replace(
            slow, spec=msgspec.structs.replace(slow.spec, downloads={"shards/0.zip": stalling.url})
        )
        await send(log, worker_id, slow)
        await send(log, worker_id, start_work(["sleep", "60"], work_id="small", assignment_id="small-s0-e1"))
        started = await wait_records(log, "JOBS", lambda rs: of(rs, JobStarted), "the second job started")
        assert [r.subject.split(".")[2] for r in started if isinstance(r.event, JobStarted)] == ["small"]
        await wait_records(
            log,
            "HEARTBEATS",
            lambda rs: sorted(rs[-1].event.running) == ["big-s0-e1", "small-s0-e1"],
            "a beat naming the fetching assignment too",
        )
        await send(log, worker_id, StopWork(work_id="big", assignment_id="big-s0-e1", epoch=1, reason="x"))
        await asyncio.wait_for(stalling.closed.wait(), 10)  # the download was abandoned
        await wait_records(
            log, "HEARTBEATS", lambda rs: rs[-1].event.running == ["small-s0-e1"], "the dropped one gone"
        )
    jobs = await records(log, "JOBS", "job.*.big.>")
    assert not of(jobs, JobStarted) and not of(jobs, JobFailed)  # dropped before it started: no events
    assert not [p for p in (agent.work_dir / "big-s0-e1").rglob("*") if p.is_file()]  # no partial
