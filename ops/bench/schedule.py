"""Benchmark scheduling: placement throughput, heartbeat ingest, failure detection with real agents.

(About 750 lines: three benchmarks that share one private server, fleet and report; a program
run by hand, not a module anything imports.)

Placement. 10,000 simulated workers (:class:`agent.simulated.SimulatedFleet`: a seeded mix of A100,
H100, L40S, RTX 4090 and CPU hosts over five regions) register and heartbeat once with a one-hour
interval (so none turns silent during the run); 20,000 one-shard jobs are submitted in one
``append_many``: CPU jobs and one-GPU jobs with VRAM hints, GPU types and a preferred region, so
that every decision filters and ranks. A real :class:`ops.coordinator.Coordinator` then catches
up and places them; a placement counts when its ``job.placed`` append is acknowledged, timed from
the moment the coordinator has caught up to the last one; ``placed_and_started_per_s`` also waits
for every ``start_work`` command. The baseline beside it, same run and server: what the log alone
sustains for the same appends, with raw nats-py ``js.publish`` awaited in parallel with the
coordinator's bound and no decision: per job a ``job.placed`` (same headers, expected sequence
included) and its ``start_work`` command (the ratio), and ``job.placed`` alone.
Both on the shipped server config (``sync_interval: always``: durable) and on a server without
per-write fsync (the client-bound figure).

Heartbeat ingest. 10,000 simulated workers heartbeat at 1 Hz from a child process (a tenth of them
every 0.1 s, one ``append_many`` per slice, as independent agents' beats spread over the second);
a LIVENESS :class:`projections.runner.ProjectionRunner` follows live in
this process. A beat's lag is the time it is applied minus its server store time. The baseline:
one beat of every worker published with raw nats-py ``js.publish``, awaited in parallel (what the
server stores per second).

Failure detection. Three real agent processes (``python -m ops.cli agent``, 1 s heartbeats) and a
coordinator in this process; per trial a ``sleep 3600`` job starts, the agent running it is
SIGKILLed: ``detect_s`` is the kill to the ``worker.lost`` store time, ``replace_s`` from that to
the store time of the replacement's ``job.placed`` (epoch 2). The killed agent's orphaned workload
is reaped, the job cancelled and its replacement stopped, and the agent restarted for the next trial.

Usage: ``python -m ops.bench.schedule [--quick]``. ``--quick``: 2,000 workers and 2,000 jobs, 2,000
heartbeating workers for 10 s, 2 trials (the durable steps it has left still wait on the disk).

One file on purpose: a benchmark is one program run as ``python -m ops.bench.schedule``; its three
parts (placement, ingest, failover) share the report and the child-process plumbing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import nats
import uvloop

from agent.runtimes.process import reap_orphans
from agent.simulated import BEAT_SLICES, SimulatedFleet
from core.log import EventLog, new_event_id
from core.settings import Settings
from core.streams import command_subject, heartbeat_subject, job_filter, job_subject
from core.wire import EXPECTED_LAST_SUBJECT_SEQ, EXPECTED_LAST_SUBJECT_SEQ_SUBJECT, MSG_ID
from ops.bench.common import emit, machine, median, private_nats, process_peak_rss_mb, self_peak_rss_mb, table
from ops.cli.workers import enroll_state_dir
from ops.coordinator import Coordinator
from ops.services import intake
from projections import LIVENESS
from projections.runner import ProjectionRunner
from schemas import (
    Assignment,
    Heartbeat,
    JobCancelled,
    JobPlaced,
    JobResources,
    JobSubmitted,
    Provenance,
    StartWork,
    StopWork,
    WorkerLost,
    WorkSpec,
    encode,
)

REPO = Path(__file__).resolve().parents[2]
APPEND_CHUNK = 512
"""Appends in flight per chunk in the raw baseline (the coordinator's own bound)."""
PEERS = {
    "kube-scheduler": "810 pods/s at 5,000 nodes",
    "Slurm": "500 jobs/s",
    "Nomad": "~20 s to detect a lost node",
    "Kubernetes": "50 s (node-monitor-grace-period)",
}
GPU_JOBS: tuple[tuple[str | None, int, int], ...] = (
    # (GPU type, VRAM hint MiB, weight): a mix that fits the simulated fleet's free VRAM
    ("A100", 24_000, 5),
    ("H100", 40_000, 3),
    ("L40S", 16_000, 1),
    ("RTX4090", 8_000, 2),
    (None, 12_000, 2),
)
REGIONS = (None, "eu-west", "us-east", "ap-south")


def job_resources(i: int) -> tuple[JobResources, str | None]:
    """Job ``i``'s needs and preferred region: 3 in 10 are CPU jobs, the rest one-GPU jobs."""
    region = REGIONS[i % len(REGIONS)]
    if i % 10 < 3:
        return JobResources(cpus=1, memory_mb=2048), region
    weighted = [kind for kind in GPU_JOBS for _ in range(kind[2])]
    gpu_type, vram_mb, _ = weighted[(i * 7) % len(weighted)]
    return JobResources(gpus=1, vram_mb=vram_mb, gpu_type=gpu_type, cpus=2, memory_mb=8192), region


def submissions(count: int, prefix: str = "j") -> Iterator[tuple[str, JobSubmitted, str]]:
    for i in range(count):
        resources, region = job_resources(i)
        event = JobSubmitted(
            name=f"{prefix}{i}",
            kind="process",
            shards=1,
            command=["true"],
            resources=resources,
            region=region,
            priority=i % 3,
        )
        tenant = f"tenant{i % 20}"
        yield job_subject(tenant, f"{prefix}{i}", event), event, f"submit-{tenant}-{prefix}{i}"


def p(values: list[float] | deque[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] if ordered else 0.0


# -- placement -----------------------------------------------------------------------------------


async def bounded(coros: Iterator[Awaitable[Any]], chunk: int = APPEND_CHUNK) -> list[Any]:
    """Await ``coros`` in parallel, ``chunk`` at a time, the next chunk started before the last
    is awaited (at most two chunks in flight)."""
    results: list[Any] = []
    inflight: deque[asyncio.Future[list[Any]]] = deque()
    batch: list[Awaitable[Any]] = []
    for coro in coros:
        batch.append(coro)
        if len(batch) == chunk:
            inflight.append(asyncio.gather(*batch))
            batch = []
            if len(inflight) > 1:
                results += await inflight.popleft()
    if batch:
        inflight.append(asyncio.gather(*batch))
    while inflight:
        results += await inflight.popleft()
    return results


async def raw_placements(url: str, count: int, *, commands: bool) -> float:
    """Jobs per second whose ``job.placed`` (and, with ``commands``, ``start_work`` command) raw
    nats-py appends, expected-sequence headers included and no decision: what the log alone
    sustains for the coordinator's appends on this server."""
    nc = await nats.connect(url, name="bench-raw")
    js = nc.jetstream(timeout=60.0)
    provenance = Provenance(candidates=10_000, filtered={"gpu_type": 7_000, "pruned": 2_995}, top=[])
    spec = WorkSpec(runtime="process", command=["true"], gpus=1, vram_mb=24_000, cpus=2.0)
    payloads = []
    for i in range(count):
        tenant, job_id = f"tenant{i % 20}", f"raw{i}{'c' if commands else ''}"
        worker_id = f"sim-7-{i % 10_000:06d}"
        a = Assignment(assignment_id=f"{job_id}-s0-e1", worker_id=worker_id, slot=0, epoch=1, gpus=1)
        event = JobPlaced(assignments=[a], provenance=provenance)
        headers = {
            MSG_ID: new_event_id(),
            EXPECTED_LAST_SUBJECT_SEQ: "0",
            EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: job_filter(tenant, job_id),
        }
        payloads.append((job_subject(tenant, job_id, event), encode(event), headers))
        if commands:
            start = StartWork(
                tenant=tenant, work_id=job_id, work_kind="job", assignment_id=a.assignment_id,
                slot=0, epoch=1, spec=spec, price_micros_per_gpu_hour=2_000_000,
            )  # fmt: skip
            payloads.append((command_subject(worker_id), encode(start), {MSG_ID: f"start-{a.assignment_id}"}))
    started = time.perf_counter()
    await bounded(js.publish(s, d, headers=h) for s, d, h in payloads)
    elapsed = time.perf_counter() - started
    await nc.close()
    return count / elapsed


async def placement_run(url: str, workers: int, jobs: int) -> dict[str, Any]:
    """Register ``workers``, submit ``jobs``, run a coordinator until all are placed (or it stalls)."""
    settings = Settings(nats_url=url, ack_timeout_s=60.0)
    async with await EventLog.connect(settings, name="bench-setup") as log:
        await log.ensure_streams()
        fleet = SimulatedFleet(log, workers, interval_s=3600.0, seed=7)
        await fleet.register()
        await fleet.beat()
        await log.append_many(submissions(jobs))
    own = await EventLog.connect(Settings(nats_url=url), name="bench-coordinator")
    coordinator = Coordinator(own, name="bench-coordinator")
    stop = asyncio.Event()
    task = asyncio.create_task(coordinator.run(stop))
    try:
        loaded = time.perf_counter()
        await asyncio.gather(*(r.caught_up.wait() for r in coordinator.runners))
        started = time.perf_counter()
        catch_up_s = started - loaded
        last, last_at = 0, started
        while coordinator.placements < jobs and time.perf_counter() - last_at < 30.0:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
            if coordinator.placements != last:
                last, last_at = coordinator.placements, time.perf_counter()
        elapsed = last_at - started
        placed = coordinator.placements
        while len(coordinator._commanded) < placed and time.perf_counter() - last_at < 60.0:
            await asyncio.sleep(0.05)
        commands_s = time.perf_counter() - started
        commanded = len(coordinator._commanded)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)
        await own.close()
    decisions = list(coordinator.decision_ms)
    return {
        "placed": placed,
        "waited": jobs - placed,
        "placements_per_s": placed / elapsed if elapsed else 0.0,
        "placed_and_started_per_s": commanded / commands_s if commands_s else 0.0,
        "place_s": elapsed,
        "commands_s": commands_s,
        "catch_up_s": catch_up_s,
        "conflicts": coordinator.conflicts,
        "decisions": len(decisions),
        "decision_p50_ms": p(decisions, 0.5),
        "decision_p99_ms": p(decisions, 0.99),
    }


async def placement(workers: int, jobs: int, *, sync_always: bool) -> dict[str, Any]:
    label = "durable (sync_interval: always)" if sync_always else "no per-write fsync"
    print(f"placement, {label}: {workers:,} workers, {jobs:,} jobs", flush=True)
    with private_nats(sync_always=sync_always) as server:
        ours = await placement_run(server.url, workers, jobs)
        print(
            f"  coordinator: {ours['placed']:,} placed in {ours['place_s']:.2f}s = "
            f"{ours['placements_per_s']:,.0f}/s; decision p50 {ours['decision_p50_ms']:.3f} ms, "
            f"p99 {ours['decision_p99_ms']:.3f} ms; catch-up {ours['catch_up_s']:.2f}s; "
            f"every start command sent after {ours['commands_s']:.2f}s "
            f"({ours['placed_and_started_per_s']:,.0f} placed and started/s); {ours['conflicts']} conflicts",
            flush=True,
        )
        raw = await raw_placements(server.url, jobs, commands=True)
        raw_placed = await raw_placements(server.url, jobs, commands=False)
        print(
            f"  raw js.publish awaited in parallel, no decision: job.placed and start_work "
            f"{raw:,.0f} jobs/s, job.placed alone {raw_placed:,.0f}/s",
            flush=True,
        )
        server_rss = process_peak_rss_mb(server.pid or 0)
    return {
        **ours,
        "raw_placed_and_started_per_s": raw,
        "raw_placed_eps": raw_placed,
        "ratio": ours["placed_and_started_per_s"] / raw,
        "nats_rss_mb": server_rss,
    }


# -- heartbeat ingest ----------------------------------------------------------------------------


async def fleet_child(url: str, workers: int, seconds: float) -> None:
    """Child process: ``workers`` simulated workers heartbeating at 1 Hz for ``seconds`` (or until
    SIGTERM); prints one JSON line when registered and one with its counts at the end."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with await EventLog.connect(Settings(nats_url=url, ack_timeout_s=30.0), name="bench-fleet") as log:
        fleet = SimulatedFleet(log, workers, interval_s=1.0, seed=11)
        await fleet.register()
        print(json.dumps({"registered": workers}), flush=True)
        ticks: list[float] = []  # how long one slice's append took
        step = fleet.interval_s / BEAT_SLICES
        started = next_at = loop.time()
        while not stop.is_set() and loop.time() - started < seconds:
            tick = loop.time()
            await fleet.beat(len(ticks) % BEAT_SLICES, BEAT_SLICES)
            ticks.append(loop.time() - tick)
            next_at = max(next_at + step, loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), next_at - loop.time())
        elapsed = loop.time() - started
    print(
        json.dumps(
            {
                "sent": fleet.beats_sent,
                "failed": fleet.beats_failed,
                "ticks": len(ticks),
                "tick_p50_s": p(ticks, 0.5),
                "tick_max_s": max(ticks, default=0.0),
                "elapsed_s": elapsed,
                "peak_rss_mb": process_peak_rss_mb(os.getpid()),  # ru_maxrss counts the parent at fork
            }
        ),
        flush=True,
    )


def start_child(*argv: str, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=err, env=child_env()
        )


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env.update(extra)
    return env


def stop_child(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def read_json_line(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
    if not line:
        raise RuntimeError(f"child {proc.args!r} exited with {proc.wait()}")
    result: dict[str, Any] = json.loads(line)
    return result


async def raw_beats(url: str, fleet: SimulatedFleet) -> float:
    """Heartbeats per second the server stores from raw nats-py ``js.publish`` of pre-encoded beats,
    one per worker of ``fleet``, awaited in parallel: the ceiling of ingest on this server."""
    payloads = [
        (heartbeat_subject(w.worker_id), encode(Heartbeat(interval_s=1.0, gpus=w.telemetry, cpu_pct=12.5)))
        for w in fleet.workers
    ]
    nc = await nats.connect(url, name="bench-raw-beats")
    js = nc.jetstream(timeout=60.0)
    started = time.perf_counter()
    await bounded(js.publish(s, d, headers={MSG_ID: new_event_id()}) for s, d in payloads)
    elapsed = time.perf_counter() - started
    await nc.close()
    return len(payloads) / elapsed


async def ingest(workers: int, seconds: float, *, sync_always: bool, warmup_s: float = 3.0) -> dict[str, Any]:
    """Heartbeats of ``workers`` at 1 Hz from a child process, a LIVENESS runner following here."""
    label = "durable (sync_interval: always)" if sync_always else "no per-write fsync"
    print(f"heartbeat ingest, {label}: {workers:,} workers at 1 Hz for {seconds:g}s", flush=True)
    with private_nats(sync_always=sync_always) as server, tempfile.TemporaryDirectory() as tmp:
        async with await EventLog.connect(Settings(nats_url=server.url), name="bench-ingest") as log:
            await log.ensure_streams()
            runner = ProjectionRunner(log, LIVENESS, write_snapshots=False)
            lags: list[float] = []
            window: list[int] = [0, 0]  # store time range measured, ns

            def measure(record: Any) -> None:
                if window[0] <= record.time_ns <= window[1]:
                    lags.append((time.time_ns() - record.time_ns) / 1e9)

            runner.listeners.append(measure)
            stop = asyncio.Event()
            task = asyncio.create_task(runner.run(stop))
            child = start_child(
                "ops.bench.schedule", "--fleet", str(workers), "--url", server.url,
                "--seconds", str(seconds + warmup_s), log_path=Path(tmp) / "fleet.log",
            )  # fmt: skip
            try:
                await read_json_line(child, 120)
                window[:] = [
                    time.time_ns() + int(warmup_s * 1e9),
                    time.time_ns() + int((warmup_s + seconds) * 1e9),
                ]
                fleet = await read_json_line(child, seconds + warmup_s + 120)
                await asyncio.sleep(2.0)  # the runner applies what is still on its way
            finally:
                stop_child(child)
                stop.set()
                await task
            raw = await raw_beats(server.url, SimulatedFleet(log, workers, interval_s=1.0, seed=11))
        server_rss = process_peak_rss_mb(server.pid or 0)
    measured = (window[1] - window[0]) / 1e9
    result = {
        "workers": workers,
        "seconds": measured,
        "beats_acked_per_s": fleet["sent"] / fleet["elapsed_s"],
        "raw_beats_per_s": raw,
        "beats_stored_per_s": len(lags) / measured,
        "beats_failed": fleet["failed"],
        "tick_p50_s": fleet["tick_p50_s"],
        "tick_max_s": fleet["tick_max_s"],
        "lag_p50_s": p(lags, 0.5),
        "lag_p99_s": p(lags, 0.99),
        "lag_max_s": max(lags, default=0.0),
        "fleet_rss_mb": fleet["peak_rss_mb"],
        "nats_rss_mb": server_rss,
    }
    print(
        f"  acknowledged {result['beats_acked_per_s']:,.0f} beats/s (1 Hz = {workers:,}/s), "
        f"{result['beats_failed']} failed; one slice ({workers // BEAT_SLICES:,} beats) takes p50 "
        f"{result['tick_p50_s']:.2f}s, max {result['tick_max_s']:.2f}s; registry lag p50 "
        f"{result['lag_p50_s'] * 1000:.0f} ms, p99 {result['lag_p99_s'] * 1000:.0f} ms, "
        f"max {result['lag_max_s'] * 1000:.0f} ms; raw js.publish of {workers:,} beats: {raw:,.0f} beats/s",
        flush=True,
    )
    return result


# -- failure detection with real agents ----------------------------------------------------------


class Agent:
    """One real ``python -m ops.cli agent`` child process (1 s heartbeats) with its state dir."""

    def __init__(self, name: str, root: Path, url: str) -> None:
        self.name = name
        self.root = root
        self.state_dir = root / name
        self.env = child_env(RESONTECH_NATS_URL=url, RESONTECH_DATA_DIR=str(root))
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss_mb = 0.0

    def start(self) -> Agent:
        """Enroll it (as the operator: it runs with the kernel's credentials), then start it."""
        enroll_state_dir(Settings(nats_url=self.env["RESONTECH_NATS_URL"]), self.state_dir)
        argv = [sys.executable, "-m", "ops.cli", "agent", "--name", self.name]
        argv += ["--state-dir", str(self.state_dir), "--stop-grace", "2"]
        with (self.root / f"{self.name}.log").open("ab") as err:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=err, stderr=err)
        return self

    async def worker_id(self) -> str:
        path = self.state_dir / "worker_id"
        await until(path.exists, f"{self.name} wrote its worker id")
        return path.read_text().strip()

    def note_rss(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.peak_rss_mb = max(self.peak_rss_mb, process_peak_rss_mb(self.proc.pid))

    def kill(self) -> None:
        assert self.proc is not None
        self.note_rss()
        self.proc.kill()
        self.proc.wait()
        reap_orphans(self.state_dir / "work")  # its workload outlived it: kill it

    def stop(self) -> None:
        self.note_rss()
        if self.proc is not None:
            stop_child(self.proc)
        reap_orphans(self.state_dir / "work")


async def verified(log: EventLog, workers: list[str]) -> None:
    """Wait until every worker passed its verification job (the intake's ``worker.verified``)."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        done = {r.subject.split(".")[1] async for r in log.replay("WORKERS", subjects="worker.*.verified")}
        if set(workers) <= done:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"workers not verified within 60 s: {sorted(set(workers) - done)}")


async def until(predicate: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise TimeoutError(f"timed out waiting until {what}")


class Trials:
    """What the coordinator's own projections saw, with store times: lost workers, placements."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.lost_ns: dict[str, int] = {}  # worker -> store time of its latest worker.lost
        self.placed_ns: dict[tuple[str, int], int] = {}  # (job id, epoch) -> store time of job.placed
        coordinator.registry.listeners.append(self._worker)
        coordinator.schedule.listeners.append(self._job)

    def _worker(self, record: Any) -> None:
        if isinstance(record.event, WorkerLost):
            self.lost_ns[record.token(1)] = record.time_ns

    def _job(self, record: Any) -> None:
        if isinstance(record.event, JobPlaced):
            for a in record.event.assignments:
                self.placed_ns.setdefault((record.token(2), a.epoch), record.time_ns)

    def available(self, worker_ids: list[str]) -> bool:
        workers = self.coordinator.registry.state.workers
        beats = self.coordinator.liveness.state.beats
        now = time.time_ns()
        return all(
            w in workers and workers[w].state == "available" and w in beats and now - beats[w].time_ns < 2e9
            for w in worker_ids
        )

    def started(self, job_id: str, epoch: int) -> Assignment | None:
        job = self.coordinator.schedule.state.jobs.get(f"bench/{job_id}")
        for slot, a in (job.assignments if job else {}).items():
            if a.epoch == epoch and slot in job.started:  # type: ignore[union-attr]
                return a
        return None


async def trial(log: EventLog, trials: Trials, agents: dict[str, Agent], n: int) -> dict[str, Any]:
    """Start a job, SIGKILL its agent, time the detection and the replacement, clean up."""
    job_id = f"fail{n}"
    await until(lambda: trials.available(list(agents)), "every agent available")
    event = JobSubmitted(
        name=job_id, kind="process", shards=1, command=["sleep", "3600"],
        resources=JobResources(cpus=0.25, memory_mb=64),
    )  # fmt: skip
    await log.append(job_subject("bench", job_id, event), event)
    first = await until(lambda: trials.started(job_id, 1), f"{job_id} started")
    victim = agents[first.worker_id]
    killed_ns = time.time_ns()
    victim.kill()
    await until(lambda: trials.lost_ns.get(first.worker_id, 0) > killed_ns, "worker.lost")
    lost_ns = trials.lost_ns[first.worker_id]
    await until(lambda: (job_id, 2) in trials.placed_ns, "the replacement placed")
    placed_ns = trials.placed_ns[(job_id, 2)]
    second = await until(lambda: trials.started(job_id, 2), "the replacement started")
    cancelled = JobCancelled(by="bench", reason="trial over")
    await log.append(job_subject("bench", job_id, cancelled), cancelled)
    stop = StopWork(work_id=job_id, assignment_id=second.assignment_id, epoch=2, reason="trial over")
    await log.append(command_subject(second.worker_id), stop)
    victim.start()  # same state dir, same worker id: it registers again and is recovered
    result = {"detect_s": (lost_ns - killed_ns) / 1e9, "replace_s": (placed_ns - lost_ns) / 1e9}
    print(
        f"  trial {n + 1}: killed {victim.name}; lost after {result['detect_s']:.2f}s, "
        f"replacement on {agents[second.worker_id].name} placed {result['replace_s'] * 1000:.0f} ms later",
        flush=True,
    )
    return result


async def failover(count: int) -> dict[str, Any]:
    print(f"failure detection: 3 real agents (1 s heartbeats), {count} SIGKILL trials", flush=True)
    with (
        private_nats(sync_always=True) as server,
        tempfile.TemporaryDirectory(prefix="resontech-agents-") as tmp,
    ):
        root = Path(tmp)
        agents = [Agent(f"agent{i}", root, server.url) for i in range(3)]
        own = await EventLog.connect(Settings(nats_url=server.url), name="bench-coordinator")
        await own.ensure_streams()
        coordinator = Coordinator(own, name="bench-coordinator")
        trials = Trials(coordinator)
        stop = asyncio.Event()
        task = asyncio.create_task(coordinator.run(stop))
        results = []
        try:
            async with intake.running(Settings(nats_url=server.url), name="bench-intake"):
                by_worker = {await agent.start().worker_id(): agent for agent in agents}
                await verified(own, list(by_worker))
                for n in range(count):
                    results.append(await trial(own, trials, by_worker, n))
                    for agent in agents:
                        agent.note_rss()
        finally:
            for agent in agents:
                agent.stop()
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
            await own.close()
    detect = [r["detect_s"] for r in results]
    replace = [r["replace_s"] for r in results]
    return {
        "detect_s": median(detect),
        "replace_s": median(replace),
        "detect_all_s": [round(d, 2) for d in detect],
        "replace_all_s": [round(r, 3) for r in replace],
        "agent_rss_mb": max(agent.peak_rss_mb for agent in agents),
    }


async def main_async(quick: bool, parts: set[str]) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)  # clean up on SIGTERM too
    workers, jobs = (2_000, 2_000) if quick else (10_000, 20_000)
    beating, seconds = (2_000, 10.0) if quick else (10_000, 30.0)
    figures: dict[str, Any] = {"bench": "schedule", "quick": quick}
    if "place" in parts:
        durable = await placement(workers, jobs, sync_always=True)
        fast = await placement(workers, jobs, sync_always=False)
        figures.update(
            placements_per_s=round(durable["placements_per_s"]),
            decision_p99_ms=round(durable["decision_p99_ms"], 3),
            decision_p50_ms=round(durable["decision_p50_ms"], 3),
            placed_and_started_per_s=round(durable["placed_and_started_per_s"]),
            raw_placed_and_started_per_s=round(durable["raw_placed_and_started_per_s"]),
            raw_placed_eps=round(durable["raw_placed_eps"]),
            placement_ratio=round(durable["ratio"], 3),
            nofsync_placements_per_s=round(fast["placements_per_s"]),
            nofsync_decision_p99_ms=round(fast["decision_p99_ms"], 3),
            nofsync_placed_and_started_per_s=round(fast["placed_and_started_per_s"]),
            nofsync_raw_placed_and_started_per_s=round(fast["raw_placed_and_started_per_s"]),
            nofsync_raw_placed_eps=round(fast["raw_placed_eps"]),
            nofsync_placement_ratio=round(fast["ratio"], 3),
            placement_workers=workers,
            placement_jobs=jobs,
            placement_waited=durable["waited"],
            placement_conflicts=durable["conflicts"],
            start_commands_s=round(durable["commands_s"], 2),
        )
    if "ingest" in parts:
        durable = await ingest(beating, seconds, sync_always=True)
        figures.update(
            registry_lag_p99_s=round(durable["lag_p99_s"], 3),
            registry_lag_p50_s=round(durable["lag_p50_s"], 3),
            heartbeat_workers=beating,
            heartbeats_acked_per_s=round(durable["beats_acked_per_s"]),
            raw_heartbeats_per_s=round(durable["raw_beats_per_s"]),
            heartbeat_tick_p50_s=round(durable["tick_p50_s"], 2),
            fleet_peak_rss_mb=round(durable["fleet_rss_mb"]),
        )
        if not quick:  # the client-bound figure; --quick keeps to the shipped config
            fast = await ingest(beating, seconds, sync_always=False)
            figures.update(
                nofsync_registry_lag_p99_s=round(fast["lag_p99_s"], 3),
                nofsync_registry_lag_p50_s=round(fast["lag_p50_s"], 3),
                nofsync_heartbeats_acked_per_s=round(fast["beats_acked_per_s"]),
                nofsync_raw_heartbeats_per_s=round(fast["raw_beats_per_s"]),
                nofsync_heartbeat_tick_p50_s=round(fast["tick_p50_s"], 2),
            )
    if "failover" in parts:
        found = await failover(2 if quick else 5)
        figures.update(
            detect_s=round(found["detect_s"], 2),
            replace_s=round(found["replace_s"], 3),
            detect_all_s=found["detect_all_s"],
            replace_all_s=found["replace_all_s"],
            agent_peak_rss_mb=round(found["agent_rss_mb"]),
        )
    figures["peak_rss_mb"] = round(self_peak_rss_mb())
    return {**figures, **machine()}


def summary(f: dict[str, Any]) -> str:
    """The human-readable table: our figure, the baseline or the peers, the target."""
    rows: list[tuple[str, ...]] = [("figure", "ours", "baseline / peers (quoted, not measured)", "target")]
    if "placements_per_s" in f:
        rows += [
            (
                "durable placements/s",
                f"{f['placements_per_s']:,}",
                f"kube-scheduler {PEERS['kube-scheduler']}, Slurm {PEERS['Slurm']}",
                ">= 2,000",
            ),
            (
                "  placed and started/s (2 appends each)",
                f"{f['placed_and_started_per_s']:,}",
                f"raw appends, no decision: {f['raw_placed_and_started_per_s']:,}/s "
                f"(ratio {f['placement_ratio']}); job.placed alone {f['raw_placed_eps']:,}/s",
                "-",
            ),
            ("decision p99 (ms)", f"{f['decision_p99_ms']}", f"p50 {f['decision_p50_ms']} ms", "-"),
            (
                "placements/s, no per-write fsync",
                f"{f['nofsync_placements_per_s']:,}",
                f"placed and started {f['nofsync_placed_and_started_per_s']:,}/s; raw "
                f"{f['nofsync_raw_placed_and_started_per_s']:,}/s (ratio {f['nofsync_placement_ratio']})",
                "(client-bound)",
            ),
        ]
    if "registry_lag_p99_s" in f:
        rows += [
            (
                "registry lag p99 (s), durable",
                f"{f['registry_lag_p99_s']}",
                f"p50 {f['registry_lag_p50_s']} s; {f['heartbeats_acked_per_s']:,} beats/s acknowledged "
                f"of {f['heartbeat_workers']:,}/s offered; raw {f['raw_heartbeats_per_s']:,}/s",
                "< 1",
            )
        ]
    if "nofsync_registry_lag_p99_s" in f:
        rows += [
            (
                "registry lag p99 (s), no fsync",
                f"{f['nofsync_registry_lag_p99_s']}",
                f"{f['nofsync_heartbeats_acked_per_s']:,} beats/s acknowledged; "
                f"raw {f['nofsync_raw_heartbeats_per_s']:,}/s",
                "(client-bound)",
            )
        ]
    if "detect_s" in f:
        rows += [
            (
                "SIGKILL -> lost (s), median",
                f"{f['detect_s']}",
                f"trials {f['detect_all_s']}; Nomad {PEERS['Nomad']}, Kubernetes {PEERS['Kubernetes']}",
                "<= 3",
            ),
            (
                "lost -> replacement placed (s), median",
                f"{f['replace_s']}",
                f"trials {f['replace_all_s']}",
                "<= 1",
            ),
        ]
    rss = f"peak RSS: bench process (coordinator, runners) {f['peak_rss_mb']} MB"
    if "fleet_peak_rss_mb" in f:
        rss += f", simulated fleet of {f['heartbeat_workers']:,} {f['fleet_peak_rss_mb']} MB"
    if "agent_peak_rss_mb" in f:
        rss += f", one agent {f['agent_peak_rss_mb']} MB"
    return table(rows) + "\n" + rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    parser.add_argument("--only", default="place,ingest,failover", help=argparse.SUPPRESS)
    parser.add_argument("--fleet", type=int, help=argparse.SUPPRESS)  # the ingest's child process
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fleet:
        uvloop.run(fleet_child(args.url, args.fleet, args.seconds))
        return
    figures = uvloop.run(main_async(args.quick, set(args.only.split(","))))
    print()
    print(summary(figures))
    emit(figures)


if __name__ == "__main__":
    main()
