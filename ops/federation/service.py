"""The federation service (``resontech federation``): one federation per live federated job.

It follows the schedule projection; every federated job that is not terminal gets a
:class:`~ops.federation.federation.FederationTask`, which provisions, serves (while the job can run)
and tears down that job's federation. The FL servers run here, on the kernel side, rather than on one
of the job's agents: the server holds the global model and the job's certificates, its loss would
cost the whole job (not one shard), and every agent of the job stays interchangeable. The tenant's
training code runs on the agents; only a tenant's server-side code (a ``persistor``, a job folder's
server components) runs here, in the job's own directory with a clean environment
(:mod:`ops.federation.server`).

Several instances (``--instance NAME``, on one host or several) share the work: each job is served
by the one instance that holds its claim on the log (:mod:`ops.federation.claims`), and only while
that claim is renewed; the others take it over when its holder stops renewing. Each instance fences
itself: a watchdog process (:mod:`ops.federation.fence`) kills its FL servers once its claims may
have lapsed, even while the service cannot run. A named instance keeps its federations in
``<data dir>/federations/<instance>/``; an unnamed one (named ``<host>-<pid>`` on the log) in
``<data dir>/federations/`` as before. Two services never share a directory (a lock refuses the
second).

Restarts and takeovers: an instance that stops releases its claims (one that is killed lets them
lapse); the next holder re-adopts each job from the log: it provisions nothing again (it serves the
federation its clients hold kits of, from its own directory or from the archive the first holder
stored: :mod:`ops.federation.handover`), starts the FL server at the same address and resumes the job
from its last checkpointed round. The clients reconnect by themselves.

Settings (environment): ``RESONTECH_FEDERATION_HOST``, the name clients dial to reach the FL servers
(default ``localhost``: every server binds loopback only; any other name binds every interface, and
must resolve to this host for the clients: with several hosts, to whichever serves);
``RESONTECH_FEDERATION_IDLE_S``, how long a job may wait for a worker before its FL server stops
(default 30); ``RESONTECH_FEDERATION_LEASE_S``, how long an instance may stay silent before another
takes its jobs over (default 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from core.errors import ConfigError
from core.federation_claims import LEASE_S
from core.log import EventLog
from core.objects import s3_client
from core.settings import Settings
from core.streams import token
from ops.federation import fence
from ops.federation.claims import ClaimKeeper
from ops.federation.federation import IDLE_S, Context, FederationTask
from ops.federation.server import FederationError, kill_federation
from ops.process import service_connection
from projections import SCHEDULE
from projections.runner import ProjectionRunner
from projections.schedule import TERMINAL, ScheduleState, job_key

log = logging.getLogger("resontech.federation")
HOST_ENV = "RESONTECH_FEDERATION_HOST"
IDLE_ENV = "RESONTECH_FEDERATION_IDLE_S"
LEASE_ENV = "RESONTECH_FEDERATION_LEASE_S"
LOCK_FILE = ".lock"
FENCE_PID_FILE = "fence.pid"
RETRY_S = 5.0
"""A federation task that crashed (a bug, not a failed job) is started again after this long; it
resumes from the job's last checkpointed round."""


class FederationService:
    """Runs the FL servers of the federated jobs this instance holds the claims of.

    Args:
        event_log: the log.
        root: the directory this instance's federations live in.
        host: the name the clients dial (see the module docstring).
        tick_s: how often to look for new federated jobs without a new event.
        idle_s: how long a job may wait for a worker before its FL server stops.
        instance: this instance's name on the log (default :func:`default_instance`).
        lease_s: how long this instance may stay silent before another takes its jobs over.
    """

    def __init__(
        self,
        event_log: EventLog,
        root: Path,
        *,
        host: str = "localhost",
        tick_s: float = 0.25,
        idle_s: float = IDLE_S,
        instance: str | None = None,
        lease_s: float = LEASE_S,
    ) -> None:
        self.log = event_log
        self.root = root
        self.host = host
        self.tick_s = tick_s
        self.idle_s = idle_s
        self.instance = instance or default_instance()
        self.schedule = ProjectionRunner(event_log, SCHEDULE, write_snapshots=False)
        self.claims = ClaimKeeper(event_log, self.instance, self._live_jobs, lease_s=lease_s, fence_root=root)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.crashed: dict[str, float] = {}

    def _state(self) -> ScheduleState:
        return self.schedule.state

    def _live_jobs(self) -> list[str]:
        return [
            key
            for key, job in self._state().jobs.items()
            if job.spec.kind == "federated" and job.state not in TERMINAL
        ]

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; then stop every FL server and release the claims (the jobs
        resume on another instance, or on the next run)."""
        s = self.log.settings
        ctx = Context(
            log=self.log,
            s3=s3_client(s.s3_endpoint, s.s3_access_key, s.s3_secret_key, region=s.s3_region),
            root=self.root,
            host=self.host,
            schedule=self._state,
            idle_s=self.idle_s,
            claims=self.claims,
        )
        with _exclusive(self.root), _fence(self.root) as watchdog:
            claiming = asyncio.Event()
            follower = asyncio.create_task(self.schedule.run(stop))
            keeper: asyncio.Task[None] | None = None
            try:
                await self.schedule.caught_up.wait()
                self._reap_ended()
                keeper = asyncio.create_task(self.claims.run(claiming))
                await _first(self.claims.caught_up.wait(), keeper)
                log.info(
                    "federation service %s (incarnation %s) caught up; %s",
                    self.instance,
                    self.claims.incarnation,
                    self.root,
                )
                while not stop.is_set():
                    self._check(keeper, watchdog)
                    self._drop_lost()
                    self._spawn(ctx)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.tick_s)
            finally:
                stop.set()
                for task in self.tasks.values():
                    task.cancel()
                await asyncio.gather(*self.tasks.values(), return_exceptions=True)
                if keeper is not None and not keeper.done():
                    await self.claims.release("the federation service stopped")
                claiming.set()
                await asyncio.gather(follower, *([keeper] if keeper else []), return_exceptions=True)

    def _check(self, keeper: asyncio.Task[None], watchdog: subprocess.Popen[bytes]) -> None:
        """The claim keeper and the fence must run for this instance to serve anything."""
        if keeper.done():
            raise FederationError(f"the claim keeper stopped: {keeper.exception()!r}")
        if watchdog.poll() is not None:
            raise FederationError(f"the fence of {self.root} exited with status {watchdog.returncode}")

    def _drop_lost(self) -> None:
        """Stop at once the federation of every job whose claim another instance took."""
        for key, task in list(self.tasks.items()):
            if not self.claims.holds(key) and not task.done():
                holder = self.claims.holder(key)
                log.warning(
                    "%s: %s holds it now: stopping its FL server",
                    key,
                    holder.instance if holder else "nobody",
                )
                task.cancel()

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
            if job.spec.kind != "federated" or job.state in TERMINAL or key in self.tasks:
                continue
            if self.claims.holder(key) is None:
                self.claims.wake.set()  # claim it now, not at the next beat
            if not self.claims.holds(key) or now - self.crashed.get(key, -RETRY_S) < RETRY_S:
                continue
            federation = FederationTask(ctx, job.tenant, job.job_id)
            self.tasks[key] = asyncio.create_task(federation.drive(), name=f"federation {key}")

    def _reap_ended(self) -> None:
        """Kill what a crashed service left running here for jobs that have since ended."""
        jobs = self._state().jobs
        for job_dir in self.root.glob("*/*"):
            tenant, job_id = job_dir.parent.name, job_dir.name
            job = jobs.get(job_key(tenant, job_id))
            if job is None or job.state in TERMINAL:
                kill_federation(job_dir, f"{tenant}/{job_id}")


async def _first(waited: Any, keeper: asyncio.Task[None]) -> None:
    """Wait for ``waited``, unless the keeper fails first (its error is raised)."""
    waiting = asyncio.ensure_future(waited)
    done, _ = await asyncio.wait({waiting, keeper}, return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:
        waiting.cancel()
        keeper.result()
        raise FederationError("the claim keeper stopped before it caught up")


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[IO[str]]:
    """Hold ``root``'s lock for the service's life (the kernel drops it however the process dies).

    Raises:
        ConfigError: another federation service uses ``root``.
    """
    root.mkdir(parents=True, exist_ok=True)
    with (root / LOCK_FILE).open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another federation service uses {root}: give each instance a name of its own (--instance)"
            ) from None
        yield lock


@contextlib.contextmanager
def _fence(root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The fence watchdog of ``root`` (:mod:`ops.federation.fence`) while the block runs; it starts
    with nothing to serve, and is stopped once every FL server is. The watchdog of a dead service on
    the same directory (this one holds its lock) is stopped first, and what that service left
    running killed: none of it is this incarnation's to serve."""
    argv = [sys.executable, "-I", fence.__file__, str(root)]
    pid_file = root / FENCE_PID_FILE
    with contextlib.suppress(OSError, ValueError):
        old = int(pid_file.read_text())
        if Path(f"/proc/{old}/cmdline").read_bytes().split(b"\0")[2:4] == [a.encode() for a in argv[2:]]:
            os.kill(old, signal.SIGKILL)
    fence.write_serving_until(root, float("-inf"))
    fence.kill_servers(root)
    watchdog = subprocess.Popen([*argv, str(os.getpid())], stdin=subprocess.DEVNULL, start_new_session=True)
    pid_file.write_text(str(watchdog.pid))
    try:
        yield watchdog
    finally:
        fence.write_serving_until(root, float("-inf"))
        watchdog.terminate()
        watchdog.wait()


def default_instance() -> str:
    """``<hostname>-<pid>``, made a subject token."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", f"{socket.gethostname()}-{os.getpid()}")
    return name[-64:]


async def serve(
    settings: Settings, root: Path, *, instance: str | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run the federation service until SIGINT or SIGTERM (or ``stop``).

    Args:
        settings: the kernel's settings.
        root: an absolute ``<data dir>/federations``; a named ``instance`` works in
            ``root/<instance>``.
        instance: this instance's name (default :func:`default_instance`, working in ``root``).
    """
    if instance is not None:
        root = root / token(instance, "instance")
    async with service_connection(settings, "federation", stop) as (event_log, stopping):
        service = FederationService(
            event_log,
            root,
            host=os.environ.get(HOST_ENV) or "localhost",
            idle_s=_seconds(IDLE_ENV, IDLE_S),
            instance=instance,
            lease_s=_seconds(LEASE_ENV, LEASE_S, positive=True),
        )
        await service.run(stopping)


def _seconds(name: str, default: float, *, positive: bool = False) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        value = -1.0
    if value < 0 or (positive and value == 0):
        what = "a positive number" if positive else "a number"
        raise SystemExit(f"{name} must be {what} of seconds, not {os.environ.get(name)!r}")
    return value
