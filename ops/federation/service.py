"""The federation service (``resontech federation``): one federation per live federated job.

It follows the schedule projection; every federated job that is not terminal gets a
:class:`~ops.federation.federation.FederationTask`, which provisions, serves (while the job can run)
and tears down that job's federation. The FL servers run here, on the kernel side, rather than on one
of the job's agents: the server holds the global model and the job's certificates, its loss would
cost the whole job (not one shard), and every agent of the job stays interchangeable. The tenant's
training code runs on the agents; only a tenant's server-side code (a ``persistor``, a job folder's
server components) runs here, in the job's own directory with a clean environment
(:mod:`ops.federation.server`).

Restarts: a service that stops (or is killed) leaves its jobs to the next one, which re-adopts every
live federated job from the log: it provisions nothing again (the clients keep their certificates),
kills what the last service left of the FL server, starts it again and resumes each job from its last
checkpointed round.

Settings (environment): ``RESONTECH_FEDERATION_HOST``, the name clients dial to reach the FL servers
(default ``localhost``: every server binds loopback only; any other name binds every interface, and
must resolve to this host for the clients); ``RESONTECH_FEDERATION_IDLE_S``, how long a job may wait
for a worker before its FL server stops (default 30).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from core.log import EventLog
from core.objects import s3_client
from core.proctags import kill_tagged
from core.settings import Settings
from ops.federation.federation import IDLE_S, Context, FederationTask
from ops.federation.server import TAG
from ops.process import service_connection
from projections import SCHEDULE
from projections.runner import ProjectionRunner
from projections.schedule import TERMINAL, ScheduleState, job_key

log = logging.getLogger("resontech.federation")
HOST_ENV = "RESONTECH_FEDERATION_HOST"
IDLE_ENV = "RESONTECH_FEDERATION_IDLE_S"
RETRY_S = 5.0
"""A federation task that crashed (a bug, not a failed job) is started again after this long; it
resumes from the job's last checkpointed round."""


class FederationService:
    """Runs the federations of every live federated job.

    Args:
        event_log: the log.
        root: the directory federations live in (``<data dir>/federations``).
        host: the name the clients dial (see the module docstring).
        tick_s: how often to look for new federated jobs without a new event.
        idle_s: how long a job may wait for a worker before its FL server stops.
    """

    def __init__(
        self,
        event_log: EventLog,
        root: Path,
        *,
        host: str = "localhost",
        tick_s: float = 0.25,
        idle_s: float = IDLE_S,
    ) -> None:
        self.log = event_log
        self.root = root
        self.host = host
        self.tick_s = tick_s
        self.idle_s = idle_s
        self.schedule = ProjectionRunner(event_log, SCHEDULE, write_snapshots=False)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.crashed: dict[str, float] = {}

    def _state(self) -> ScheduleState:
        return self.schedule.state

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; then stop every FL server (the jobs resume on the next run)."""
        s = self.log.settings
        ctx = Context(
            log=self.log,
            s3=s3_client(s.s3_endpoint, s.s3_access_key, s.s3_secret_key, region=s.s3_region),
            root=self.root,
            host=self.host,
            schedule=self._state,
            idle_s=self.idle_s,
        )
        follower = asyncio.create_task(self.schedule.run(stop))
        try:
            await self.schedule.caught_up.wait()
            self._reap_ended()
            log.info("federation service caught up; %s", self.root)
            while not stop.is_set():
                self._spawn(ctx)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.tick_s)
        finally:
            stop.set()
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), follower, return_exceptions=True)

    def _spawn(self, ctx: Context) -> None:
        now = time.monotonic()
        for key, task in list(self.tasks.items()):
            if task.done():
                if not task.cancelled() and task.exception() is not None:
                    log.error(
                        "federation %s crashed; again in %.0fs", key, RETRY_S, exc_info=task.exception()
                    )
                    self.crashed[key] = now
                del self.tasks[key]
        for key, job in self._state().jobs.items():
            if now - self.crashed.get(key, -RETRY_S) < RETRY_S:
                continue
            if job.spec.kind == "federated" and job.state not in TERMINAL and key not in self.tasks:
                federation = FederationTask(ctx, job.tenant, job.job_id)
                self.tasks[key] = asyncio.create_task(federation.drive(), name=f"federation {key}")

    def _reap_ended(self) -> None:
        """Kill what a crashed service left running for jobs that have since ended."""
        jobs = self._state().jobs
        for job_dir in self.root.glob("*/*"):
            tenant, job_id = job_dir.parent.name, job_dir.name
            job = jobs.get(job_key(tenant, job_id))
            if job is None or job.state in TERMINAL:
                kill_tagged(TAG, f"{tenant}/{job_id}")


async def serve(settings: Settings, root: Path, *, stop: asyncio.Event | None = None) -> None:
    """Run the federation service on ``root`` (an absolute ``<data dir>/federations``) until SIGINT or
    SIGTERM (or ``stop``)."""
    async with service_connection(settings, "federation", stop) as (event_log, stopping):
        service = FederationService(
            event_log,
            root,
            host=os.environ.get(HOST_ENV) or "localhost",
            idle_s=_seconds(IDLE_ENV, IDLE_S),
        )
        await service.run(stopping)


def _seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        value = -1.0
    if value < 0:
        raise SystemExit(f"{name} must be a number of seconds, not {os.environ.get(name)!r}")
    return value
