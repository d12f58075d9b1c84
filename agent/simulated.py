"""Thousands of simulated workers in one process: FOR LOAD TESTS ONLY, never a default.

Selected by ``resontech agent --simulate N`` or used directly by a benchmark. Every simulated worker
registers with made-up GPUs (a seeded mix of A100, H100, L40S, RTX 4090 and CPU-only hosts over a few
regions) and heartbeats at ``interval_s``: a tenth of the fleet every tenth of the interval, each
slice through ONE batched :meth:`EventLog.append_many`, not a task per worker. Telemetry is computed
once per worker and re-sent, so a tick costs encoding and publishing only.

With ``accept_commands`` each worker also consumes its command queue (one durable consumer per
worker: fine for hundreds, heavy for thousands) and answers ``StartWork`` with ``job.started``; with
``complete_after_s`` each started shard is reported completed (``job.shard_completed``) after that
long. Simulated workers never run anything.

The fleet speaks as the kernel, not as agents: it needs kernel credentials, and it appends its
workers' registrations (with a ``worker.verified`` vouching for them) and its shards' started and
completed events straight to WORKERS and JOBS, where an agent's words pass through the intake
(:mod:`ops.services.intake`). That is what a load test of placement and heartbeats wants; it is never an
agent's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from agent.devices import SimulatedDevices
from agent.reports import Append
from core.errors import ResontechError
from core.log import EventLog
from core.streams import heartbeat_subject, job_subject, worker_subject
from schemas.commands import StartWork, StopWork
from schemas.jobs import JobShardCompleted, JobStarted
from schemas.values import GpuTelemetry
from schemas.workers import Heartbeat, WorkerRegistered, WorkerVerified

log = logging.getLogger("resontech.agent.simulated")

HARDWARE: tuple[tuple[str, int, tuple[int, ...], int], ...] = (
    # (NVML model name, VRAM MiB, GPU counts to draw from, weight)
    ("NVIDIA A100-SXM4-80GB", 81_920, (1, 2, 4, 8), 3),
    ("NVIDIA H100 80GB HBM3", 81_559, (1, 8), 2),
    ("NVIDIA L40S", 46_068, (1, 4), 1),
    ("NVIDIA GeForce RTX 4090", 24_564, (1, 2), 4),
    ("", 0, (0,), 1),  # CPU only
)
REGIONS = ("eu-west", "eu-central", "us-east", "us-west", "ap-south")
BEAT_SLICES = 10
"""A fleet heartbeats a tenth of its workers every tenth of an interval: independent agents' beats
spread over the interval instead of arriving in one burst."""


@dataclass
class SimulatedWorker:
    """One simulated worker: its id, registration, fixed telemetry and the work it pretends to run."""

    worker_id: str
    registration: WorkerRegistered
    telemetry: list[GpuTelemetry]
    running: dict[str, StartWork] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)


class SimulatedFleet:
    """``count`` simulated workers sharing one :class:`EventLog`.

    Args:
        log: the event log.
        count: how many workers.
        interval_s: heartbeat interval (default 1 s).
        seed: seeds the hardware mix and ids (same seed, same fleet).
        prefix: worker ids are ``<prefix>-<seed>-<n>``.
        provider / pool: of every worker.
        accept_commands: consume commands and answer ``StartWork`` with ``job.started``.
        complete_after_s: report a started one-shard job completed after this many seconds.
        racks: spread the workers over this many racks, 8 to a block (``topology``); 0: none.
    """

    def __init__(
        self,
        log: EventLog,
        count: int,
        *,
        interval_s: float = 1.0,
        seed: int = 0,
        prefix: str = "sim",
        provider: str = "sim-provider",
        pool: str = "shared",
        accept_commands: bool = False,
        complete_after_s: float | None = None,
        racks: int = 0,
    ) -> None:
        self.log = log
        self.interval_s = interval_s
        self.accept_commands = accept_commands
        self.complete_after_s = complete_after_s
        rng = random.Random(seed)
        self.workers = [
            _make_worker(f"{prefix}-{seed}-{n:06d}", rng, provider, pool, n, racks) for n in range(count)
        ]
        self.beats_sent = 0
        self.beats_failed = 0

    async def register(self) -> None:
        """Register every worker and vouch for it (load tests only), in one batched append."""
        vouched = WorkerVerified(by="simulated fleet (load tests only)")
        await self.log.append_many(
            [(worker_subject(w.worker_id, WorkerRegistered), w.registration) for w in self.workers]
            + [(worker_subject(w.worker_id, WorkerVerified), vouched) for w in self.workers]
        )

    async def beat(self, part: int = 0, parts: int = 1) -> None:
        """Send one heartbeat for every worker of slice ``part`` of ``parts`` (default: all), in one
        batched append (failures are counted)."""
        items: list[tuple[str, Any]] = [
            (
                heartbeat_subject(w.worker_id),
                Heartbeat(
                    interval_s=self.interval_s,
                    gpus=w.telemetry,
                    cpu_pct=12.5,
                    memory_used_mb=8192,
                    running=list(w.running),
                ),
            )
            for w in self.workers[part::parts]
        ]
        try:
            await self.log.append_many(items)
            self.beats_sent += len(items)
        except Exception as exc:
            self.beats_failed += len(items)
            log.warning("simulated heartbeats failed: %s", exc)

    async def run(self, stop: asyncio.Event) -> None:
        """Register, then heartbeat every ``interval_s`` until ``stop`` is set, a slice of the fleet
        at a time (:data:`BEAT_SLICES`)."""
        await self.register()
        log.info("simulated fleet: %d workers registered", len(self.workers))
        intake = (
            [asyncio.create_task(self._take_commands(w)) for w in self.workers]
            if self.accept_commands
            else []
        )
        loop = asyncio.get_running_loop()
        next_at, n = loop.time(), 0
        try:
            while not stop.is_set():
                await self.beat(n % BEAT_SLICES, BEAT_SLICES)
                await self._complete_due()
                n += 1
                next_at = max(next_at + self.interval_s / BEAT_SLICES, loop.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), next_at - loop.time())
        finally:
            for task in intake:
                task.cancel()
            await asyncio.gather(*intake, return_exceptions=True)

    async def _take_commands(self, worker: SimulatedWorker) -> None:
        async with contextlib.aclosing(self.log.commands(worker.worker_id)) as commands:
            async for record, ack in commands:
                try:
                    await self._answer(worker, record.event)
                except ResontechError as exc:  # not acknowledged: delivered again after the ack wait
                    log.warning("simulated worker %s: %s", worker.worker_id, exc.message)
                    continue
                await ack()

    async def _answer(self, worker: SimulatedWorker, cmd: StartWork | StopWork) -> None:
        if isinstance(cmd, StopWork):
            worker.running.pop(cmd.assignment_id, None)
            worker.due.pop(cmd.assignment_id, None)
            return
        if cmd.assignment_id in worker.running:
            return
        worker.running[cmd.assignment_id] = cmd
        if self.complete_after_s is not None:
            worker.due[cmd.assignment_id] = time.monotonic() + self.complete_after_s
        started = JobStarted(
            assignment_id=cmd.assignment_id, worker_id=worker.worker_id, slot=cmd.slot, epoch=cmd.epoch
        )
        subject = job_subject(cmd.tenant, cmd.work_id, started)
        await self.log.append(subject, started, event_id=f"{cmd.assignment_id}-started")

    async def _complete_due(self) -> None:
        now = time.monotonic()
        items: list[Append] = []
        for worker in self.workers:
            for assignment_id in [a for a, t in worker.due.items() if t <= now]:
                del worker.due[assignment_id]
                cmd = worker.running.pop(assignment_id)
                if cmd.work_kind == "job":
                    done = JobShardCompleted(
                        assignment_id=assignment_id,
                        worker_id=worker.worker_id,
                        slot=cmd.slot,
                        epoch=cmd.epoch,
                    )
                    items.append(
                        (job_subject(cmd.tenant, cmd.work_id, done), done, f"{assignment_id}-shard-completed")
                    )
        if items:
            await self.log.append_many(items)


def _make_worker(
    worker_id: str, rng: random.Random, provider: str, pool: str, n: int, racks: int = 0
) -> SimulatedWorker:
    model, vram, counts, _ = rng.choices(HARDWARE, weights=[h[3] for h in HARDWARE])[0]
    devices = SimulatedDevices(rng.choice(counts), model, vram, seed=n) if model else None
    gpus = devices.inventory() if devices else []
    registration = WorkerRegistered(
        provider=provider,
        hostname=f"{worker_id}.sim",
        region=rng.choice(REGIONS),
        pool=pool,  # type: ignore[arg-type]
        gpus=gpus,
        cpus=rng.choice((8, 16, 32, 64)),
        memory_mb=rng.choice((65_536, 131_072, 262_144)),
        driver="simulated",
        agent_version="simulated",
        labels={"simulated": "true"},
        topology={"rack": f"r{n % racks}", "block": f"b{n % racks // 8}"} if racks else {},
    )
    return SimulatedWorker(worker_id, registration, devices.telemetry() if devices else [])
