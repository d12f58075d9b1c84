"""Failure detection with real agents: SIGKILL the agent running a job, time its loss and its
replacement (part of ``python -m ops.bench.schedule``).

Three real agent processes (``python -m ops.cli agent``, 1 s heartbeats, :class:`ops.bench.agents.Agent`)
and a coordinator in this process; per trial a ``sleep 3600`` job starts, the agent running it is
SIGKILLed: ``detect_s`` is the kill to the ``worker.lost`` store time, ``replace_s`` from that to
the store time of the replacement's ``job.placed`` (epoch 2). The killed agent's orphaned workload
is reaped, the job cancelled and its replacement stopped, and the agent restarted for the next trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from core.log import EventLog
from core.settings import Settings
from core.streams import command_subject, job_subject
from ops.bench.agents import Agent, until
from ops.bench.common import median, private_nats
from ops.coordinator import Coordinator
from ops.services import intake
from projections import LIVENESS, REGISTRY, SCHEDULE
from projections.runner import ProjectionRunner
from schemas.commands import StopWork
from schemas.jobs import JobCancelled, JobPlaced, JobResources, JobSubmitted
from schemas.values import Assignment
from schemas.workers import WorkerLost


async def verified(log: EventLog, workers: list[str]) -> None:
    """Wait until every worker passed its verification job (the intake's ``worker.verified``)."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        done = {r.subject.split(".")[1] async for r in log.replay("WORKERS", subjects="worker.*.verified")}
        if set(workers) <= done:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"workers not verified within 60 s: {sorted(set(workers) - done)}")


class Trials:
    """What the log shows, with store times: lost workers, placements. It follows projections of its
    own (not the coordinator's), so it observes the coordinator only through what it appends."""

    def __init__(self, event_log: EventLog) -> None:
        self.registry = ProjectionRunner(event_log, REGISTRY, write_snapshots=False)
        self.liveness = ProjectionRunner(event_log, LIVENESS, write_snapshots=False)
        self.schedule = ProjectionRunner(event_log, SCHEDULE, write_snapshots=False)
        self.lost_ns: dict[str, int] = {}  # worker -> store time of its latest worker.lost
        self.placed_ns: dict[tuple[str, int], int] = {}  # (job id, epoch) -> store time of job.placed
        self.registry.listeners.append(self._worker)
        self.schedule.listeners.append(self._job)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the log until ``stop`` is set."""
        await asyncio.gather(*(r.run(stop) for r in (self.registry, self.liveness, self.schedule)))

    def _worker(self, record: Any) -> None:
        if isinstance(record.event, WorkerLost):
            self.lost_ns[record.token(1)] = record.time_ns

    def _job(self, record: Any) -> None:
        if isinstance(record.event, JobPlaced):
            for a in record.event.assignments:
                self.placed_ns.setdefault((record.token(2), a.epoch), record.time_ns)

    def available(self, worker_ids: list[str]) -> bool:
        workers = self.registry.state.workers
        beats = self.liveness.state.beats
        now = time.time_ns()
        return all(
            w in workers and workers[w].state == "available" and w in beats and now - beats[w].time_ns < 2e9
            for w in worker_ids
        )

    def started(self, job_id: str, epoch: int) -> Assignment | None:
        job = self.schedule.state.jobs.get(f"bench/{job_id}")
        for slot, a in (job.assignments if job else {}).items():
            if a.epoch == epoch and slot in job.started:  # type: ignore[union-attr]
                return a
        return None


async def trial(log: EventLog, trials: Trials, agents: dict[str, Agent], n: int) -> dict[str, Any]:
    """Start a job, SIGKILL its agent, time the detection and the replacement, clean up."""
    job_id = f"fail{n}"
    await until(lambda: trials.available(list(agents)), "every agent available")
    event = JobSubmitted(
        name=job_id,
        kind="process",
        shards=1,
        command=["sleep", "3600"],
        resources=JobResources(cpus=0.25, memory_mb=64),
    )
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
    """``count`` trials with three real agents, an intake and a coordinator; medians and peak RSS."""
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
        trials = Trials(own)
        stop = asyncio.Event()
        task = asyncio.create_task(coordinator.run(stop))
        watching = asyncio.create_task(trials.run(stop))
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
                await asyncio.wait_for(asyncio.gather(task, watching), 30)
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
