"""The worker agent: thin glue between the event log, the devices, the policy and the runtimes.

Life of an agent:

1. It locks its state dir, reads (or creates) its worker id, kills workloads a crashed previous run
   left behind and reports those assignments failed (retryable), then registers
   (``worker.<id>.registered``, and ``worker.<id>.policy_set`` when it has a policy file).
   Everything the agent says about its worker and its work is a *claim* on the intake
   (``intake.<id>.<subject>``, :mod:`ops.services.intake`): the kernel checks it and stores its own event, or
   refuses it. A refused registration comes back as a ``registration_refused`` command: the agent
   logs the reason and stops. A ``verify`` command runs the verification job
   (``python -m agent.verify``) and claims its answer.
2. It heartbeats (``hb.<id>``) every ``heartbeat_interval_s`` with GPU and host telemetry and the
   ids of the assignments it runs (:mod:`agent.heartbeat`: a slow server never slows the cadence,
   and a failed beat is logged, not fatal).
3. It takes commands from its durable consumer, one at a time, and acknowledges each after handling
   it (a command being handled when the agent stops is finished first); each command id is executed
   at most once, and a command of a stale epoch is dropped (:mod:`agent.commands`). A ``StartWork``
   is recorded as running before its workload starts, so after a crash it is reported failed
   (retryable), never run twice. ``StartWork`` is
   decided by the policy (:func:`agent.policy.decide`): refused -> ``rejected``; accepted -> the
   runtime starts it -> ``started``. The inputs (``spec.downloads``) are fetched and the runtime
   started in a task of the assignment's own, so that a multi-gigabyte shard never holds up the next
   command; meanwhile the assignment holds its GPUs and VRAM, and a stop drops it before it starts.
   ``StopWork`` sends SIGTERM to the named assignment and SIGKILL
   after the grace period: ``stop_grace_s`` with ``checkpoint`` (time to write a checkpoint and print
   ``RESONTECH_CHECKPOINT``), at most :data:`QUICK_STOP_S` without. A ``StartWork`` refused while
   other work is being stopped is judged again once that work has ended: the coordinator places
   preempting work on capacity it has just revoked.
4. Each assignment's output lines become progress / checkpoint / ready events (:mod:`agent.protocol`;
   progress at most once a second per assignment, :class:`agent.reports.ProgressCoalescer`);
   usage ticks every ``metering_interval_s`` and a final one at the exit, then the end events of
   :mod:`agent.reports`.
5. On SIGTERM or SIGINT it stops taking commands, stops every workload (SIGTERM, then SIGKILL after
   ``stop_grace_s``), reports them failed with ``retryable=True`` so the kernel re-places them at once,
   and exits 0. Workloads never outlive their agent unmetered.

One module past 500 lines on purpose: ``Agent`` is one lifecycle (register, take commands, run,
report, stop) whose methods share its state; the pieces that stand alone already live beside it
(:mod:`agent.commands`, :mod:`agent.reports`, :mod:`agent.state`, the runtimes).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgspec

from agent import host, reports
from agent.checkpoints import hold_checkpoints
from agent.commands import admit, admit_once, command_id, stops, take_commands, work_of
from agent.devices import DeviceSource
from agent.downloads import fetch_all
from agent.forwarding import forward_reports
from agent.heartbeat import Heartbeats, append_reliably
from agent.host import host_sandbox
from agent.identity import StateDirLock, owner_only, worker_id
from agent.policy import decide, requested_vram_mb
from agent.reports import Append, Meter
from agent.running import Assignments, Preparing, Running
from agent.runtimes import RUNTIMES, Runtime, StartFailed, workload_env
from agent.runtimes.process import cgroup_name, fresh_workdir, reap_orphans, started_dirs
from agent.runtimes.vllm import VllmRuntime, engine_env
from agent.runtimes.warm import WarmEngines, remove_leftovers
from agent.settings import AgentSettings, topology_of
from agent.state import CommandState
from agent.verify import run_verification
from core.clock import now_ms
from core.errors import AppendRejected, LogUnavailable, ResontechError
from core.log import EventLog
from core.sandbox import Sandbox
from core.settings import Settings, version
from core.streams import intake_subject, worker_subject
from schemas.commands import RegistrationRefused, StartWork, StopWork, VerifyWorker, WorkSpec
from schemas.envelope import Recorded
from schemas.workers import WorkerPolicy, WorkerPolicySet, WorkerRegistered

log = logging.getLogger("resontech.agent")
QUICK_STOP_S = 2.0
LAUNCH_WAIT_S = 60.0
"""How long a stopping agent waits for runtimes in the middle of starting a workload (unpacking a
kit, converting a model) before it stops what they started."""


class Agent:
    """One worker agent. ``await Agent(...).run(stop)`` serves until ``stop`` is set.

    Args:
        settings: the agent's settings.
        core: the shared settings (NATS URL and the agent's own NATS credentials, ack time-out).
        devices: where GPUs are read from (:func:`agent.devices.select_devices`).
        policy: the provider policy, or ``None`` to accept whatever the host can run.
    """

    def __init__(
        self, settings: AgentSettings, core: Settings, *, devices: DeviceSource, policy: WorkerPolicy | None
    ) -> None:
        self.settings = settings
        self.core = core
        self.devices = devices
        self.policy = policy
        self.state_dir = Path(settings.state_dir)
        self.work_dir = Path(settings.work_dir)
        self.worker_id = ""
        self.address = ""
        self.registered = asyncio.Event()
        self.refused: str | None = None
        self._stop_event: asyncio.Event | None = None
        self._log: EventLog | None = None
        self._state = CommandState(self.state_dir)
        self.sandbox = Sandbox(bwrap=None)
        self.sandbox_problem: str | None = "not checked yet"
        self._assignments = Assignments([])
        self._busy = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self.warm = WarmEngines(self.sandbox, self.work_dir, 0, {})

    @property
    def log(self) -> EventLog:
        """The connected event log."""
        assert self._log is not None, "the agent is not connected"
        return self._log

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, register, serve until ``stop`` is set, then stop workloads and disconnect.

        Raises:
            ConfigError: the state dir is in use or unreadable.
            LogUnavailable: NATS cannot be reached, or registration failed.
        """
        lock = StateDirLock(self.state_dir)
        lock.acquire()
        try:
            self.worker_id = worker_id(self.state_dir)
            owner_only(self.state_dir, self.work_dir)
            self.sandbox, self.sandbox_problem = await asyncio.to_thread(host_sandbox, self.settings)
            if self.sandbox_problem is not None:
                log.error(
                    "workloads cannot be sandboxed on this host, so it takes no work: %s",
                    self.sandbox_problem,
                )
            elif self.sandbox.bwrap is None:
                log.warning("UNSANDBOXED (local development): workloads run as this agent's user")
            self._state = CommandState.load(self.state_dir)
            self._log = await EventLog.connect(self.core, name=f"resontech-agent-{self.worker_id}")
            try:
                await self._serve(stop)
            finally:
                await self._log.close()
        finally:
            lock.release()

    async def _serve(self, stop: asyncio.Event) -> None:
        self._stop_event = stop
        await self._recover()
        await self.register()
        beats = Heartbeats(
            self.log,
            self.worker_id,
            self.settings.heartbeat_interval_s,
            self.devices,
            has_gpus=bool(self._assignments.gpus),
            running=self._assignments.ids,
        )
        loops = [asyncio.create_task(beats.run()), asyncio.create_task(self._metering_loop())]
        commands = asyncio.create_task(take_commands(self.log, self.worker_id, self._busy, self._handle))
        sandboxed_cpu_host = not self._assignments.gpus and self.sandbox_problem is None
        count = self.settings.warm_engines if sandboxed_cpu_host else 0
        self.warm = WarmEngines(self.sandbox, self.work_dir, count, engine_env({}, gpus=0, options={}))
        self.warm.fill()
        try:
            await stop.wait()
        finally:
            async with self._busy:  # never in the middle of handling a command
                commands.cancel()
            await asyncio.gather(commands, return_exceptions=True)
            await self.warm.close()
            await self._stop_all()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    # -- registration ----------------------------------------------------------------------------

    def topology(self) -> dict[str, str]:
        """The host's network domains: the provider's labels, and NVML's NVLink domain as its clique."""
        clique = self.devices.clique()
        return {**topology_of(self.settings.topology), **({"clique": clique} if clique else {})}

    async def register(self) -> None:
        """Append ``worker.<id>.registered`` (and ``policy_set`` when there is a policy)."""
        s = self.settings
        gpus = self.devices.inventory()
        self._assignments.gpus = gpus
        event = WorkerRegistered(
            provider=s.provider,
            hostname=socket.gethostname(),
            region=s.region,
            pool=s.pool,
            owner_tenant=s.owner_tenant,
            gpus=gpus,
            cpus=host.cpu_count(),
            memory_mb=host.memory_total_mb(),
            driver=self.devices.driver(),
            agent_version=version(),
            address=s.address or host.route_address(self.core.nats_url),
            sandbox="unavailable" if self.sandbox_problem else self.sandbox.isolation,  # type: ignore[arg-type]
            sandbox_problem=(self.sandbox_problem or "")[:500],
            topology=self.topology(),
        )
        try:
            await self.log.append(self._claim(worker_subject(self.worker_id, event)), event)
            if self.policy is not None:
                policy_set = WorkerPolicySet(policy=self.policy)
                await self.log.append(self._claim(worker_subject(self.worker_id, policy_set)), policy_set)
        except (AppendRejected, LogUnavailable) as exc:
            raise LogUnavailable(f"cannot register: {exc.message} (are the streams created?)") from None
        except ResontechError as exc:
            raise LogUnavailable(f"cannot register: {exc.message}") from None
        log.info(
            "registration of worker %s (%s) claimed: %d GPUs, %d CPUs, %d MiB, pool %s",
            self.worker_id,
            s.name,
            len(gpus),
            event.cpus,
            event.memory_mb,
            s.pool,
        )
        self.address = event.address
        self.registered.set()

    async def _recover(self) -> None:
        """Kill what a crashed previous run left running, remove its workloads' cgroups and its warm
        engines' folders, and report its assignments failed."""
        started = await asyncio.to_thread(started_dirs, self.work_dir)
        reap_orphans(self.work_dir)
        if self.sandbox.cgroups is not None:
            for workdir in started:
                await asyncio.to_thread(self.sandbox.release, cgroup_name(workdir))
        await asyncio.to_thread(remove_leftovers, self.work_dir)
        interrupted = list(self._state.running.values())
        if not interrupted:
            return
        self._state.running.clear()
        self._state.save()
        await self._emit([item for cmd in interrupted for item in reports.ended(cmd, "agent_restarted")])

    # -- heartbeats and metering -----------------------------------------------------------------

    async def _metering_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.metering_interval_s)
            now = now_ms()
            ticks = [t for r in list(self._assignments.by_id.values()) if (t := r.meter.tick(now))]
            await self._emit(ticks)

    async def _emit(self, items: list[Append]) -> bool:
        """Claim ``items`` (canonical subject, event, id) on the intake."""
        return await append_reliably(self.log, [(self._claim(subject), e, i) for subject, e, i in items])

    def _claim(self, subject: str) -> str:
        return intake_subject(self.worker_id, subject)

    # -- commands --------------------------------------------------------------------------------

    async def _handle(self, record: Recorded[Any]) -> None:
        cmd = record.event
        match cmd:
            case RegistrationRefused():
                self.refused = cmd.reason
                log.error("the kernel refused this worker's registration: %s; stopping", cmd.reason)
                if self._stop_event is not None:
                    self._stop_event.set()
            case VerifyWorker():
                if admit_once(self._state, command_id(record)):
                    self._spawn(self._verify(cmd))
            case StartWork() | StopWork():
                await self._handle_work(cmd, command_id(record))
            case _:
                log.warning("command %s of unknown kind %s ignored", command_id(record), type(cmd).__name__)

    async def _handle_work(self, cmd: StartWork | StopWork, cmd_id: str) -> None:
        a = self._assignments
        here = a.by_id.get(cmd.assignment_id) or a.preparing.get(cmd.assignment_id)
        admission = admit(self._state, cmd_id, cmd, here=here.cmd if here else None)
        if admission == "duplicate":
            log.info("command %s already handled; skipped", cmd_id)
        elif admission == "stale":
            log.warning(
                "dropped stale command %s for %s: epoch %d < %d",
                cmd_id,
                cmd.work_id,
                cmd.epoch,
                self._state.epoch(work_of(cmd, here.cmd if here else None)),
            )
        elif isinstance(cmd, StartWork):
            await self._start(cmd)
        else:
            self._stop(cmd)

    async def _start(self, cmd: StartWork) -> None:
        await self._supersede(cmd)
        reason = self._refusal(cmd)
        if reason is not None and await self._wait_for_stopping():
            reason = self._refusal(cmd)  # what was being stopped (a preemption) released its share
        if reason is not None:
            log.info("rejected %s: %s", cmd.assignment_id, reason)
            await self._emit([reports.rejected(cmd, self.worker_id, reason)])
            return
        a = self._assignments
        prep = Preparing(cmd, a.free_gpus()[: cmd.spec.gpus], requested_vram_mb(cmd, a.gpu_vram_mb()))
        a.preparing[cmd.assignment_id] = prep
        self._state.running[cmd.assignment_id] = cmd  # before it starts: a crash is reported after
        self._state.save()
        prep.task = asyncio.create_task(self._launch(prep))

    async def _launch(self, prep: Preparing) -> None:
        """Fetch the inputs, then start the workload, beside the command loop: a multi-gigabyte shard
        must not hold up the next command (a stop, another start) for this agent."""
        cmd = prep.cmd
        workdir = self.work_dir / cmd.assignment_id
        try:
            await asyncio.to_thread(fresh_workdir, workdir)  # nothing an earlier run left is written through
            prep.fetch = asyncio.create_task(fetch_all(cmd.spec.downloads, workdir))
            await asyncio.wait([prep.fetch])
            if prep.cause != "exited":  # dropped while fetching: it never starts
                self._forget(cmd)
                await self._emit(reports.ended(cmd, prep.cause))
                return
            prep.fetch.result()
            env = workload_env(cmd, workdir, gpu_indices=prep.gpu_indices)
            checkpoints = await asyncio.to_thread(hold_checkpoints, workdir)
            try:
                workload = await self._runtime(cmd.spec.runtime).start(self._spec_here(cmd), workdir, env)
            except BaseException:
                checkpoints.close()
                raise
        except StartFailed as exc:
            self._forget(cmd)
            log.info("%s could not start: %s", cmd.assignment_id, exc.message)
            await self._emit([reports.start_failed(cmd, exc.message, retryable=exc.retryable)])
            return
        meter = Meter(cmd, worker_id=self.worker_id, start_ms=now_ms())
        running = Running(
            cmd=cmd,
            workload=workload,
            meter=meter,
            gpu_indices=prep.gpu_indices,
            vram_mb=prep.vram_mb,
            cause=prep.cause,
            checkpoints=checkpoints,
        )
        self._assignments.preparing.pop(cmd.assignment_id, None)
        self._assignments.by_id[cmd.assignment_id] = running
        log.info("started %s (%s %s, pid %s)", cmd.assignment_id, cmd.work_kind, cmd.work_id, workload.pid)
        if running.cause == "exited":
            await self._emit([reports.started(cmd, self.worker_id)])
        else:  # dropped while the runtime was starting it
            self._cancel(running, running.cause, QUICK_STOP_S)
        running.task = asyncio.create_task(self._supervise(running))

    def _runtime(self, name: str) -> Runtime:
        """The runtime ``name`` on this host's sandbox; a vLLM replica may become a warm engine."""
        return VllmRuntime(self.sandbox, self.warm) if name == "vllm" else RUNTIMES[name](self.sandbox)

    def _spec_here(self, cmd: StartWork) -> WorkSpec:
        """The spec as this host runs it: an engine serves on the address this worker registered
        (the kernel accepts a replica only at its worker's registered host)."""
        options = cmd.spec.options
        if not self.address or "advertise_host" in options:
            return cmd.spec
        return msgspec.structs.replace(cmd.spec, options={**options, "advertise_host": self.address})

    def _forget(self, cmd: StartWork) -> None:
        """An assignment that never started: it holds nothing and a crash has nothing to report."""
        self._assignments.preparing.pop(cmd.assignment_id, None)
        self._state.running.pop(cmd.assignment_id, None)
        self._state.save()

    async def _supersede(self, cmd: StartWork) -> None:
        """Stop older epochs of the same work and slot here, and let them release what they hold
        before ``cmd`` is decided."""
        older = self._assignments.superseded_by(cmd)
        for running in older:
            log.info(
                "%s superseded by %s (epoch %d)", running.cmd.assignment_id, cmd.assignment_id, cmd.epoch
            )
            self._cancel(running, "superseded", QUICK_STOP_S)
        tasks = [r.task for r in older if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=QUICK_STOP_S + 2 * self.core.ack_timeout_s)

    async def _wait_for_stopping(self) -> bool:
        """Wait (bounded by the stop grace) for workloads already told to stop to exit; whether any
        were. The coordinator places preempting work as soon as it sent the victim's stop, so the
        capacity it counted on frees up once the victim has checkpointed."""
        stopping = [r.task for r in self._assignments.by_id.values() if r.cause != "exited" and r.task]
        if not stopping:
            return False
        log.info("waiting for %d stopping workload(s) to release their share", len(stopping))
        await asyncio.wait(stopping, timeout=self.settings.stop_grace_s + 2 * self.core.ack_timeout_s)
        return True

    def _refusal(self, cmd: StartWork) -> str | None:
        if self.sandbox_problem is not None:
            return f"this host cannot sandbox workloads: {self.sandbox_problem}"
        if cmd.spec.runtime not in RUNTIMES:
            return f"runtime {cmd.spec.runtime!r} not available on this worker"
        if cmd.spec.image is not None:
            return f"this worker runs no container images (the work names {cmd.spec.image[:200]!r})"
        if cmd.assignment_id in self._assignments:
            return "assignment already running"
        a = self._assignments
        return decide(
            self.policy or WorkerPolicy(),
            cmd,
            running=len(a),
            now_ns=time.time_ns(),
            worker_pool=self.settings.pool,
            owner_tenant=self.settings.owner_tenant,
            free_gpus=len(a.free_gpus()),
            gpu_vram_mb=a.gpu_vram_mb(),
            vram_total_mb=a.vram_total_mb(),
            vram_claimed_mb=a.vram_claimed_mb(),
        )

    def _stop(self, cmd: StopWork) -> None:
        a = self._assignments
        running = a.by_id.get(cmd.assignment_id) or a.preparing.get(cmd.assignment_id)
        if running is None or not stops(cmd, running.cmd):  # another tenant's work is never stopped
            log.info(
                "stop for %s (epoch %d, %s %s/%s): not running here",
                cmd.assignment_id,
                cmd.epoch,
                cmd.work_kind,
                cmd.tenant,
                cmd.work_id,
            )
            return
        grace = (
            self.settings.stop_grace_s if cmd.checkpoint else min(QUICK_STOP_S, self.settings.stop_grace_s)
        )
        log.info("stopping %s (%s), grace %.1fs", cmd.assignment_id, cmd.reason, grace)
        self._cancel(running, "stopped", grace)

    def _cancel(self, running: Running | Preparing, cause: reports.EndCause, grace_s: float) -> None:
        """Stop a workload (SIGTERM, SIGKILL after ``grace_s``), or drop one still fetching."""
        if running.cause == "exited":
            running.cause = cause
        if isinstance(running, Preparing):
            if running.fetch is not None:
                running.fetch.cancel()
            return  # its launch sees the cause and never starts it (or stops it at once)
        task = asyncio.create_task(running.workload.cancel(grace_s))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- running workloads -----------------------------------------------------------------------

    async def _supervise(self, running: Running) -> None:
        try:
            await self._forward_reports(running)
        except Exception:  # a bug here must not leave the workload unreported and unmetered
            log.exception("%s: output handling failed; waiting for the exit", running.cmd.assignment_id)
        code = await running.workload.wait()
        await self._finish(running, code)

    async def _forward_reports(self, running: Running) -> None:
        def gpu_util() -> float | None:
            return self._gpu_util(running.gpu_indices) if running.gpu_indices else None

        folder = running.checkpoints
        await forward_reports(running.cmd, running.workload.lines(), folder, self._emit, gpu_util)

    async def _verify(self, cmd: VerifyWorker) -> None:
        """Run the verification job and claim its answer (an error is an answer too: the kernel
        decides what it means)."""
        log.info("running verification job %s", cmd.challenge_id)
        report = await run_verification(cmd)
        await self._emit([(worker_subject(self.worker_id, report), report, f"verify-{cmd.challenge_id}")])

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _gpu_util(self, indices: list[int]) -> float | None:
        """The mean utilisation of ``indices`` now (``None`` where NVML reports none)."""
        readings = [t.util_pct for t in self.devices.telemetry() if t.index in indices]
        known = [r for r in readings if r is not None]
        return round(sum(known) / len(known), 1) if known else None

    async def _finish(self, running: Running, code: int) -> None:
        cmd = running.cmd
        if running.checkpoints is not None:
            running.checkpoints.close()
        self._assignments.by_id.pop(cmd.assignment_id, None)
        self._state.running.pop(cmd.assignment_id, None)
        self._state.save()
        final = running.meter.tick(now_ms())
        tail = running.workload.log_tail(reports.LOG_TAIL_LINES) if code != 0 else ""
        items = ([final] if final else []) + reports.ended(
            cmd, running.cause, code, tail, worker_id=self.worker_id
        )
        log.info("%s ended (%s): %s", cmd.assignment_id, running.cause, reports.exit_reason(code))
        await self._emit(items)

    async def _stop_all(self) -> None:
        preparing = list(self._assignments.preparing.values())
        for prep in preparing:
            self._cancel(prep, "agent_stopped", 0.0)
        launches = [p.task for p in preparing if p.task is not None]
        if launches:  # a runtime mid-start (unpacking, converting a model) finishes its start first
            await asyncio.wait(launches, timeout=LAUNCH_WAIT_S)
        running = list(self._assignments.by_id.values())
        for r in running:
            self._cancel(r, "agent_stopped", self.settings.stop_grace_s)
        tasks = [r.task for r in running if r.task is not None]
        if tasks:
            log.info("stopping %d workload(s)", len(tasks))
            await asyncio.wait(tasks, timeout=self.settings.stop_grace_s + 3 * self.core.ack_timeout_s)
