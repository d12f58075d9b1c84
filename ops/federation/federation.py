"""One federated job's federation, driven from provisioning to teardown.

:meth:`FederationTask.drive` runs as one task per live federated job, from its submission. Set-up, at
once (so that a job that cannot run fails without waiting in the queue): resolve each slot's shard,
provision the federation, fetch the training code into the job's FL job folder and check it
(:mod:`ops.federation.jobfolder`), fetch the initial model, upload the client kits to the kernel's kit
bucket. Then, every ``TICK_S``, it re-reads the job (level-triggered, like the coordinator) and:

* serves only while the job can run: the FL server starts once every slot is assigned, and stops once
  the job has waited for a worker for ``idle_s`` (a lost worker's replacement is usually placed at
  once; a job that waits longer holds no FL server). ``job.federation_ready`` follows each start once
  the kernel's admin session has logged in (the coordinator starts clients only after it), and
  ``job.federation_stopped`` each stop (and a restart of this service: no client starts until the
  server is back);
* starts the FL server again if it died, and reconnects the admin session;
* with no run in flight, submits one once every slot's current assignment has started and every
  site is connected (a site whose client was replaced, or all of them after a server restart, must
  have connected since), starting at the round after the last completed one, from that round's global
  model (``job.federation_run``);
* with a run in flight, aborts it when a slot's assignment changed (its worker was lost: NVFlare cannot
  bring a new client into a running job, so the round in flight is redone by the next run, which is
  submitted as soon as the replacement has connected, while NVFlare tears the aborted one down), turns each
  global model the server wrote into ``checkpointed``, ``round_completed`` and ``progress`` events
  (uploading it first), and follows the run's status: completed -> the final model and metrics are
  uploaded and the job completes (a tenant's job folder once its run has ended, as later workflows
  may follow the training one; a run whose workflow stopped early ends the job at its last round);
  failed -> the job fails with the failing client's (or the server's) error log.

A job that ends (completed, failed, cancelled) gets its current assignments stopped, its FL server
killed and its kits (and its federation's archive) deleted. When the service itself stops (or is
killed), only the server is killed (or dies with it): the next holder of the job's claim resumes the
job from its last checkpointed round, as after a server death.

Claims (:mod:`ops.federation.claims`): a task runs only while its service holds the job's claim (the
service cancels it, killing its server, as soon as another instance holds it), and its FL server runs
only while the claim is renewed: a lapse stops the server at once (the fence's watchdog may have
already), without counting it as a death, and it starts again once a renewal shows the job is still
held. The federation it serves is the one the job's clients hold kits of: recorded on the log by the
first holder (``federation.provisioned``, before any kit is handed out) and adopted by the next
(:mod:`ops.federation.handover`).

Every transition of the FL server and its runs reads in this one class; what a run is, when the next
may start and why one failed are :mod:`ops.federation.runs`, what the job's events say
:mod:`ops.federation.reports`, and what it reads and writes :mod:`ops.federation.server`,
:mod:`ops.federation.jobfolder` and :mod:`ops.federation.workspace`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import flare, flarejob
from core.errors import ResontechError
from core.log import EventLog
from core.objects import bucket_for
from core.streams import command_subject
from ops.federation import handover, jobfolder
from ops.federation import workspace as ws
from ops.federation.claims import ClaimKeeper, ClaimLost
from ops.federation.reports import JobReporter, once
from ops.federation.runs import Run, replaced_sites, run_failure, sites_ready
from ops.federation.server import FederationError, FlareAdmin, FlareServer, Provisioned
from projections.schedule import TERMINAL, JobRecord, ScheduleState, job_key
from schemas.commands import StopWork
from schemas.jobs import JobFailed, JobFederationReady, JobFederationRun, JobFederationStopped

log = logging.getLogger("resontech.federation")
TICK_S = 0.25
STATUS_EVERY_S = 1.0
MAX_RUNS = 20
"""Runs one job may need (restarts included) before it fails instead of trying again."""
MAX_RESTARTS, RESTART_WINDOW_S = 5, 60.0
"""An FL server that dies more often than this fails the job instead of restarting again."""
IDLE_S = 30.0
"""How long a job may wait for a worker (a slot without an assignment) before its FL server stops."""


@dataclass
class Context:
    """What every federation of one service shares."""

    log: EventLog
    s3: Any
    root: Path
    host: str
    schedule: Any
    """A callable returning the live :class:`ScheduleState`."""
    claims: ClaimKeeper
    """This instance's claims: which jobs it holds, and whether it may serve them now."""
    idle_s: float = IDLE_S


class JobEnded(ResontechError):
    """The federation must fail the job: ``reason`` and ``log_tail`` go into ``job.failed``."""

    code = "job_ended"

    def __init__(self, reason: str, log_tail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


@dataclass
class FederationTask:
    """The federation of job ``tenant/job_id`` (see the module docstring)."""

    ctx: Context
    tenant: str
    job_id: str
    prov: Provisioned | None = None
    fljob: flarejob.FlJob | None = None
    server: FlareServer | None = None
    admin: FlareAdmin | None = None
    announced: bool = False
    """Whether ``job.federation_ready`` was appended since the server last started."""
    run: Run | None = None
    runs: int = 0
    pending_reason: str = "start"
    fresh_since: dict[str, float] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)
    kits: list[str] = field(default_factory=list)
    initial_model: Path | None = None
    next_status_at: float = 0.0
    restarts: list[float] = field(default_factory=list)
    lapses: int = 0
    """The claims' lapse count when the server last started (a change: it was fenced, not dead)."""
    waiting_since: float | None = None
    reports: JobReporter = field(init=False)
    """The job's events, and the last round reported."""

    def __post_init__(self) -> None:
        self.reports = JobReporter(
            self.ctx.log, self.ctx.s3, self.tenant, self.job_id, self.dir, current=self.job
        )

    @property
    def key(self) -> str:
        return job_key(self.tenant, self.job_id)

    @property
    def dir(self) -> Path:
        """The federation's directory: the FL server's sandbox writes it (read it beneath an fd)."""
        return self.ctx.root / self.tenant / self.job_id

    @property
    def private(self) -> Path:
        """The kernel's own files of this federation, where no sandbox reaches (see
        :mod:`ops.federation.server`)."""
        return self.ctx.root.with_name(f"{self.ctx.root.name}-kernel") / self.tenant / self.job_id

    def job(self) -> JobRecord | None:
        state: ScheduleState = self.ctx.schedule()
        return state.jobs.get(self.key)

    # -- the loop ------------------------------------------------------------------------------

    async def drive(self) -> None:
        """Run the job's federation until the job ends (or the task is cancelled)."""
        final = False
        try:
            job = self.job()
            if job is None or job.spec.federated is None:
                return
            self.reports.reported = job.round
            await self._prepare(job)
            while (job := self.job()) is not None and job.state not in TERMINAL:
                if await self._step(job):
                    break
                await asyncio.sleep(TICK_S)
            final = True
        except ClaimLost as exc:
            log.warning("%s: %s", self.key, exc)
        except JobEnded as exc:
            final = await self._fail(exc.reason, exc.log_tail)
        except (FederationError, ResontechError) as exc:
            final = await self._fail(f"federation failed: {exc.message}", "")
        finally:
            await self._teardown(final)

    async def _step(self, job: JobRecord) -> bool:
        if not await self._serving(job):
            return False
        assert self.server is not None and self.admin is not None
        if not self.server.alive():
            if self.lapses != self.ctx.claims.lapses:  # the fence killed it while the claim lapsed
                self._fence("the FL server was fenced while the claim lapsed")
            else:
                await self._restart_server(self.server.exit_reason())
            return False
        if not self.admin.connected:
            with contextlib.suppress(FederationError):
                await self.admin.connect()
            return False
        if not self.announced:
            await self._announce()
            return False
        await self.reports.collect_rounds(job)
        whole_run = self.run is not None and self._whole_run(job)
        if self.reports.reported >= (job.spec.rounds or 0) and not whole_run:
            return await self.reports.complete(job)  # the last global model is in: no need to wait for
            # NVFlare's own end of the run (several seconds), unless the tenant's job folder runs more
        if self.run is None:
            if await self._ready(job):
                await self._submit(job)
            return False
        lost = replaced_sites(self.run, job)
        if lost:
            for site in lost:  # its replacement connects after the loss, maybe while the abort runs
                self.fresh_since[site] = time.time()
            await self._abort(f"{', '.join(lost)} lost with its worker; a replacement rejoins")
            return False
        if time.monotonic() >= self.next_status_at:
            self.next_status_at = time.monotonic() + STATUS_EVERY_S
            return await self._follow(job)
        return False

    @staticmethod
    def _whole_run(job: JobRecord) -> bool:
        """A tenant's job folder may run workflows after the training one: wait for its run's end."""
        return job.spec.federated is not None and bool(job.spec.federated.job_folder)

    # -- set-up and teardown -------------------------------------------------------------------

    async def _prepare(self, job: JobRecord) -> None:
        assert job.spec.federated is not None
        s3, spec, shards = self.ctx.s3, job.spec.federated, job.spec.shards
        sites = [flare.site_name(slot) for slot in range(shards)]
        self.shards = await asyncio.to_thread(ws.resolve_shards, s3, self.tenant, job.spec.name, shards)
        self.prov = await handover.federation(
            self.ctx.claims,
            self.ctx.s3,
            self.dir,
            self.private,
            self.tenant,
            self.job_id,
            self.ctx.host,
            sites,
        )
        code = self.private / "job"
        self.fljob = await asyncio.to_thread(jobfolder.prepare, s3, self.tenant, spec, sites, code)
        if spec.initial_model:
            name = f"initial/{Path(spec.initial_model).name}"
            self.initial_model = await asyncio.to_thread(
                ws.fetch_beneath,
                s3,
                bucket_for(self.tenant),
                spec.initial_model,
                self.dir,
                name,
                "the initial model",
            )
        kit_files = {site: self.prov.kit_zip(site) for site in sites}
        self.kits = await asyncio.to_thread(ws.upload_kits, s3, self.tenant, self.job_id, kit_files)
        self.server = FlareServer(self.prov, f"{self.tenant}/{self.job_id}", self.private)
        self.admin = FlareAdmin(self.prov.admin_dir)
        if job.federation is not None:  # an earlier service served it: its server is gone or going
            self.pending_reason = "the federation service restarted"
            await self.reports.append(JobFederationStopped(reason=self.pending_reason), once("stopped"))

    async def _teardown(self, final: bool) -> None:
        """Stop what this federation runs; when the job ended (``final``), also its clients and kits."""
        if self.admin is not None:
            self.admin.drop()
        if self.server is not None:
            self.server.kill()
        if not final:
            return
        job = self.job()
        for assignment in job.assignments.values() if job else []:
            stop = StopWork(
                work_id=self.job_id,
                assignment_id=assignment.assignment_id,
                epoch=assignment.epoch,
                reason="the federated job ended",
                tenant=self.tenant,
                work_kind="job",
            )
            with contextlib.suppress(ResontechError):
                await self.ctx.log.append(
                    command_subject(assignment.worker_id),
                    stop,
                    event_id=f"fed-stop-{assignment.assignment_id}",
                )
        with contextlib.suppress(Exception):
            await asyncio.to_thread(ws.delete_kits, self.ctx.s3, self.kits)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(handover.delete_archives, self.ctx.s3, self.tenant, self.job_id)

    # -- the FL server -------------------------------------------------------------------------

    async def _serving(self, job: JobRecord) -> bool:
        """Start the FL server once every slot is assigned; stop it once the job has waited for a
        worker for ``idle_s``. Whether it serves."""
        assert self.server is not None
        if not self.ctx.claims.may_serve(self.key):
            if self.server.started:
                self._fence("the federation's claim on the job lapsed")
            return False
        placed = len(job.assignments) >= job.spec.shards
        now = time.monotonic()
        self.waiting_since = None if placed else (self.waiting_since or now)
        if not self.server.started:
            if placed:
                self._start_server()
            return placed
        if self.waiting_since is not None and now - self.waiting_since >= self.ctx.idle_s:
            waits = job.queue_reason or "a shard has no worker"
            await self._stop_server(f"the job waits for workers ({waits})")
            return False
        return True

    def _start_server(self) -> None:
        assert self.server is not None and self.prov is not None
        self.server.start()
        self.lapses = self.ctx.claims.lapses
        self.announced = False
        self.fresh_since = {site: time.time() for site in self.prov.sites}

    def _fence(self, why: str) -> None:
        """Kill the server now, appending nothing (the log may be out of reach): it starts again once
        the claim is renewed, as a new server (``job.federation_ready`` again)."""
        assert self.server is not None and self.admin is not None
        log.warning("%s: stopping the FL server: %s", self.key, why)
        self.admin.drop()
        self.server.kill()
        self.run = None
        self.announced = False
        self.pending_reason = why

    async def _stop_server(self, reason: str, pending: str | None = None) -> None:
        """Kill the server (and the run in flight), saying so if clients were told it was ready."""
        assert self.server is not None and self.admin is not None
        log.warning("%s: stopping the FL server: %s", self.key, reason)
        self.admin.drop()
        self.server.kill()
        self.run = None
        self.pending_reason = pending or reason
        if self.announced:
            self.announced = False
            await self.reports.append(JobFederationStopped(reason=reason), once("stopped"))

    async def _restart_server(self, why: str) -> None:
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW_S] + [now]
        if len(self.restarts) > MAX_RESTARTS:
            raise JobEnded(f"the FL server keeps dying ({len(self.restarts)} times in a minute): {why}")
        log.warning("%s: %s; restarting it", self.key, why)
        await self._stop_server(why, pending="the FL server restarted")
        self._start_server()

    async def _announce(self) -> None:
        """The admin session logged in: the server serves, clients may start."""
        assert self.prov is not None
        ready = JobFederationReady(
            server=f"{self.prov.host}:{self.prov.port}",
            sites=self.prov.sites,
            kit_bucket=flare.KIT_BUCKET,
            kits=self.kits,
            shards=self.shards,
        )
        await self.reports.append(ready, once("ready"))
        self.announced = True

    # -- runs ----------------------------------------------------------------------------------

    async def _ready(self, job: JobRecord) -> bool:
        """Every slot's current assignment started, and every site connected (recently enough)."""
        assert self.admin is not None and self.prov is not None
        return await sites_ready(self.admin, self.prov, job, self.fresh_since)

    async def _submit(self, job: JobRecord) -> None:
        assert self.admin is not None and self.prov is not None and job.spec.federated is not None
        if self.runs >= MAX_RUNS:
            raise JobEnded(f"the federation needed more than {MAX_RUNS} runs; giving up")
        number = self.runs + 1
        first = self.reports.reported + 1
        rounds = (job.spec.rounds or 0) - self.reports.reported
        start_model, resume_key = await self._start_model(job, first)
        folder = self.private / "runs" / str(number) / f"{job.spec.name}-run{number}"
        await asyncio.to_thread(self._write_run, folder, job, first, rounds, start_model)
        run_id = await self.admin.call(lambda s: s.submit_job(str(folder)))
        self.runs = number
        epochs = {slot: a.epoch for slot, a in job.assignments.items()}
        self.run = Run(run_id=run_id, number=number, first_round=first, rounds=rounds, epochs=epochs)
        self.next_status_at = time.monotonic() + STATUS_EVERY_S
        log.info(
            "%s: run %d (%s) from round %d, %d rounds (%s)",
            self.key,
            number,
            run_id,
            first,
            rounds,
            self.pending_reason,
        )
        event = JobFederationRun(
            run_id=run_id,
            first_round=first,
            rounds=rounds,
            reason=self.pending_reason,
            resume_from=resume_key,
        )
        await self.reports.append(event, f"run-{run_id}")

    async def _start_model(self, job: JobRecord, first: int) -> tuple[Path | None, str | None]:
        """The model round ``first`` starts from, and its workspace key: the previous round's global
        model (downloaded again from the workspace), else the tenant's initial model."""
        if first == 1:
            spec = job.spec.federated
            return self.initial_model, spec.initial_model if spec else None
        root = ws.output_root(job.spec.name, job.spec.output_prefix)
        key = ws.checkpoint_key(root, first - 1)
        # always the workspace's copy (the one checked and reported), written beneath the folder's
        # fd: the server's own copy, or a link in its place, is the sandbox's to change
        local = await asyncio.to_thread(
            ws.fetch_beneath,
            self.ctx.s3,
            bucket_for(self.tenant),
            key,
            self.dir,
            f"rounds/{flare.round_stem(first - 1)}.npz",
            "the last global model",
        )
        return local, key

    def _write_run(self, folder: Path, job: JobRecord, first: int, rounds: int, model: Path | None) -> None:
        assert self.fljob is not None
        documents = flarejob.run_documents(
            self.fljob,
            name=folder.name,
            first_round=first,
            rounds=rounds,
            out_dir=str(self.dir / "rounds"),
            start_model=str(model) if model else None,
        )
        jobfolder.write_run(folder, self.private / "job", self.fljob, documents)

    async def _abort(self, why: str) -> None:
        """Abort the run in flight and forget it: once NVFlare has the abort, the run writes no more
        rounds, and the next run may start while it is torn down (which takes NVFlare seconds more;
        the server runs two jobs at a time for this, :func:`core.flare.server_resources`)."""
        assert self.run is not None and self.admin is not None
        log.warning("%s: aborting run %s: %s", self.key, self.run.run_id, why)
        self.pending_reason = why
        run_id, self.run = self.run.run_id, None
        with contextlib.suppress(FederationError):
            await self.admin.call(lambda s: s.abort_job(run_id))

    async def _follow(self, job: JobRecord) -> bool:
        """Check the run's status; whether the job is done."""
        assert self.run is not None and self.admin is not None and self.prov is not None
        run_id = self.run.run_id
        try:
            meta = await self.admin.call(lambda s: s.get_job_meta(run_id))
        except FederationError:
            return False
        outcome = flare.run_outcome(meta.get("status"))
        if outcome == "running":
            return False
        if outcome == "completed":
            first, self.run = self.run.first_round, None
            await self.reports.collect_rounds(job)
            if self.reports.reported >= (job.spec.rounds or 0):
                return False  # the next step completes the job
            if self.reports.reported < first:
                raise JobEnded(f"FL run {run_id} completed without finishing a round")
            log.info("%s: the training workflow stopped at round %d", self.key, self.reports.reported)
            return await self.reports.complete(job)  # it stopped early (e.g. FedAvg's stop_cond)
        if outcome == "aborted":
            self.run = None
            if not self.pending_reason or self.pending_reason == "start":
                self.pending_reason = f"run {run_id} was aborted"
            return False
        raise JobEnded(*await run_failure(self.prov, run_id, str(meta.get("status"))))

    # -- the end -------------------------------------------------------------------------------

    async def _fail(self, reason: str, log_tail: str) -> bool:
        """Fail the job (unless it already ended); whether it is now ended."""
        if not self.ctx.claims.holds(self.key):
            log.warning("%s: not failing the job (another instance holds it): %s", self.key, reason)
            return False
        log.warning("%s: failing the job: %s", self.key, reason)
        for _ in range(5):
            job = self.job()
            if job is None or job.state in TERMINAL:
                return True
            failed = JobFailed(reason=reason, log_tail=log_tail, retryable=False)
            if await self.reports.append_terminal(failed):
                return True
            await asyncio.sleep(TICK_S)
        return False
