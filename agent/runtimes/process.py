"""The ``process`` runtime: ``spec.command`` as a child process in a per-assignment working dir.

* The workload runs in the host's sandbox (:mod:`core.sandbox`: its own mount, PID and user
  namespaces, the assignment's directory its only writable place, its cgroup and rlimits), in its own
  session and process group, with the clean environment of :func:`agent.runtimes.base.workload_env`,
  stdin closed, and stdout and stderr captured together to ``<workdir>/log.txt`` (at most
  :data:`MAX_LOG_BYTES`; later output is still read, not stored).
* ``cancel`` sends SIGTERM to the workload's processes, then SIGKILL after the grace period.
* When the main process exits, whatever it left behind is killed, so nothing keeps running (and
  computing, unmetered) after the agent reported the exit: the sandbox (its PID namespace ends with
  it), its process group, its cgroup, and any process that left the group (``setsid``: torchrun
  starts every rank in a session of its own) but still carries the workload's marks in its
  environment (:func:`kill_marked`; an unsandboxed workload has only these).
* Every workload dies with the agent, however the agent dies (``--die-with-parent``,
  ``PR_SET_PDEATHSIG``): nothing runs on unwatched and unmetered. ``<workdir>/pid`` names the main
  process while it runs: :func:`reap_orphans` kills what a crashed agent may still have left behind
  when it starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from agent.runtimes.base import StartFailed, checkpoint_dir
from core.proctags import marked
from core.protocol import LINE_LIMIT
from core.reports import tail_of
from core.sandbox import Sandbox, signal_workload
from schemas.commands import WorkSpec

log = logging.getLogger("resontech.agent")
LOG_FILE = "log.txt"
PID_FILE = "pid"
MAX_LOG_BYTES = 64 * 1024 * 1024
_EOF = None
MARKER = "RESONTECH_ASSIGNMENT_ID"
_POLL_S = 0.2


class ProcessRuntime:
    """Runs ``spec.command`` (argv, no shell) as a local process in ``sandbox``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    async def start(
        self, spec: WorkSpec, workdir: Path, env: Mapping[str, str], *, commands: bool = False
    ) -> ProcessWorkload:
        """Start the command (``commands``: see :func:`spawn`). Raises :class:`StartFailed` for an
        empty command or one that cannot run."""
        if not spec.command:
            raise StartFailed("empty command")
        prepare(workdir)
        return await spawn(spec.command, workdir, env, sandbox=self.sandbox, spec=spec, commands=commands)


def prepare(workdir: Path) -> None:
    """Create the per-assignment folders a workload finds (data, checkpoints, tmp), owner-only: the
    agent's other assignments and the host's other users have no business in them."""
    for sub in (workdir, workdir / "data", checkpoint_dir(workdir), workdir / "tmp"):
        sub.mkdir(mode=0o700, parents=True, exist_ok=True)


async def spawn(
    argv: list[str],
    workdir: Path,
    env: Mapping[str, str],
    *,
    sandbox: Sandbox,
    spec: WorkSpec,
    workload: type[ProcessWorkload] | None = None,
    commands: bool = False,
) -> ProcessWorkload:
    """Start ``argv`` in ``workdir`` as its workload, in ``sandbox`` with the limits of ``spec`` (a
    ``workload`` subclass wraps it, if given). ``commands``: its standard input is a pipe the agent
    writes one command to (:meth:`ProcessWorkload.command`), else it is closed.

    Raises:
        StartFailed: the executable cannot run, or its cgroup cannot be made.
    """
    name = cgroup_name(workdir)
    (workdir / "tmp").mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        preexec = sandbox.preexec(name, sandbox.limits(spec.memory_mb))
    except OSError as exc:
        raise StartFailed(f"cannot make the workload's cgroup: {exc.strerror or exc}") from None
    if not _runnable(argv[0], workdir, sandbox.search_path(env)):
        sandbox.release(name)
        raise StartFailed(f"cannot start {argv[0]!r}: No such file or directory")
    try:
        proc = await asyncio.create_subprocess_exec(
            *sandbox.command(argv, workdir, gpus=spec.gpus > 0),
            cwd=workdir,
            env=dict(env),
            stdin=asyncio.subprocess.PIPE if commands else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            limit=LINE_LIMIT,
            preexec_fn=preexec,
        )
    except OSError as exc:
        sandbox.release(name)
        raise StartFailed(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    (workdir / PID_FILE).write_text(str(proc.pid))
    return (workload or ProcessWorkload)(proc, workdir, sandbox)


def cgroup_name(workdir: Path) -> str:
    """The name of a workload's cgroup: its assignment, and a digest of its directory, since two
    agents of one host (or two kernels' agents) may run assignments of the same name."""
    digest = hashlib.sha256(str(workdir.absolute()).encode()).hexdigest()[:12]
    return f"{workdir.name}-{digest}"


def _runnable(program: str, workdir: Path, path: str) -> bool:
    """Whether ``program`` names a file the workload can execute: a path (relative to ``workdir``),
    or a name on ``path``. Checked before the start: in a sandbox, bwrap would only report it once
    the workload ran and failed."""
    if "/" in program:
        return os.access(workdir / program, os.X_OK)
    return shutil.which(program, path=path) is not None


class ProcessWorkload:
    """A running :class:`ProcessRuntime` workload (see :class:`agent.runtimes.base.Workload`)."""

    def __init__(self, proc: asyncio.subprocess.Process, workdir: Path, sandbox: Sandbox) -> None:
        self._proc = proc
        self.workdir = workdir
        self.sandbox = sandbox
        self.log_path = workdir / LOG_FILE
        self.pid_path = workdir / PID_FILE
        # Unbounded: the agent always drains it, and a slow server must never block the workload's
        # output (backpressure would stall training, not the agent).
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._pump = asyncio.create_task(self._read_output())
        self._reaper = asyncio.create_task(self._reap())

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        code = self._proc.returncode
        return None if code is None else self.sandbox.exit_status(code)

    def _signal(self, sig: signal.Signals) -> None:
        signal_workload(self._proc.pid, sig, sandboxed=self.sandbox.bwrap is not None)

    async def _read_output(self) -> None:
        stream = self._proc.stdout
        assert stream is not None
        written = 0
        try:
            with self.log_path.open("ab") as sink:
                while True:
                    try:
                        chunk = await stream.readline()
                    except ValueError:  # a line longer than LINE_LIMIT: take it in pieces
                        chunk = await stream.read(LINE_LIMIT)
                    if not chunk:
                        break
                    if written < MAX_LOG_BYTES:
                        sink.write(chunk)
                        sink.flush()
                        written += len(chunk)
                    self._lines.put_nowait(chunk.decode(errors="replace").rstrip("\r\n"))
        finally:
            self._lines.put_nowait(_EOF)

    async def _reap(self) -> int:
        proc = self._proc
        # asyncio (3.11) only wakes proc.wait() once the output is closed too, so the exit is
        # watched through returncode, which is set as soon as the process is reaped.
        while proc.returncode is None and not self._pump.done():
            await asyncio.wait([self._pump], timeout=_POLL_S)
        if proc.returncode is None:  # the output closed first: the exit follows
            await proc.wait()
        else:
            # A child that outlives the main process may hold the output open: give it a moment,
            # then end the group, so the output ends too and nothing runs on after the reported exit.
            await asyncio.wait([self._pump], timeout=1.0)
        self._signal(signal.SIGKILL)
        await asyncio.to_thread(kill_marked, self.workdir)
        await asyncio.to_thread(self.sandbox.release, cgroup_name(self.workdir))
        await asyncio.wait([self._pump], timeout=1.0)
        self._pump.cancel()  # only a process that left the group (setsid) can still hold the output
        await asyncio.wait([self._pump])
        if not self._pump.cancelled() and self._pump.exception() is not None:
            log.warning("output of pid %d not fully captured: %s", proc.pid, self._pump.exception())
        with contextlib.suppress(OSError):
            self.pid_path.unlink()
        assert proc.returncode is not None
        return self.sandbox.exit_status(proc.returncode)

    async def lines(self) -> AsyncIterator[str]:
        while (line := await self._lines.get()) is not _EOF:
            yield line

    async def command(self, line: bytes) -> None:
        """Write ``line`` to its standard input (a pipe: ``spawn(commands=True)``) and close it.

        Raises:
            StartFailed: it exited before it could take the line.
        """
        stdin = self._proc.stdin
        assert stdin is not None, "started without a command pipe"
        try:
            stdin.write(line)
            await stdin.drain()
            stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            raise StartFailed("the engine exited before it took its command") from None

    def moved_to(self, workdir: Path) -> None:
        """Its directory was renamed to ``workdir`` (:mod:`agent.warm`): its log and pid file are
        there now. Its marks (:func:`kill_marked`) and cgroup keep the name it started with, which
        the pid file records for :func:`reap_orphans`."""
        self.log_path = workdir / LOG_FILE
        self.pid_path = workdir / PID_FILE
        with contextlib.suppress(OSError):
            self.pid_path.write_text(f"{self._proc.pid} {self.workdir.name}")

    async def wait(self) -> int:
        return await asyncio.shield(self._reaper)

    async def cancel(self, grace_s: float) -> int:
        if self._proc.returncode is None:
            self._signal(signal.SIGTERM)
            await asyncio.wait([self._reaper], timeout=grace_s)
            if self._proc.returncode is None:
                self._signal(signal.SIGKILL)
                await asyncio.to_thread(kill_marked, self.workdir)
        return await self.wait()

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.log_path, n)


def log_tail(path: Path, n: int = 40) -> str:
    """The last ``n`` lines of a log file (empty if unreadable), from at most its last 64 KiB."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65_536))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return tail_of(text.splitlines(), n)


def kill_marked(workdir: Path) -> list[int]:
    """SIGKILL every process marked as the workload of ``workdir``, whatever its session, and return
    their pids. The marks are what :func:`agent.runtimes.base.workload_env` sets and children
    inherit: ``HOME`` is the folder and ``RESONTECH_ASSIGNMENT_ID`` its name (unique on the host:
    the folder lies in one agent's state dir). Only processes this user may read are seen, which is
    every process a workload starts."""
    marks = {f"HOME={workdir}".encode(), f"{MARKER}={workdir.name}".encode()}
    killed = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid() and marked(pid, marks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
    return killed


def started_dirs(work_dir: Path) -> list[Path]:
    """Every workload folder in ``work_dir``, and the folder a warm engine started in before a replica
    took it (its cgroup is named after that one: :meth:`ProcessWorkload.moved_to`)."""
    found = [d for d in work_dir.iterdir() if d.is_dir()] if work_dir.is_dir() else []
    for pid_file in work_dir.glob(f"*/{PID_FILE}"):
        with contextlib.suppress(OSError):
            _, _, marked_as = pid_file.read_text().strip().partition(" ")
            if marked_as and "/" not in marked_as:
                found.append(work_dir / marked_as)
    return found


def reap_orphans(work_dir: Path) -> list[str]:
    """Kill workloads a previous run of the agent left running; return their assignment ids.

    A process counts as ours only if its environment still names the assignment (so a recycled pid
    is never killed): the folder's name, or the name the pid file gives after the pid (a warm engine
    started under its own name, :meth:`ProcessWorkload.moved_to`).
    """
    reaped = []
    for pid_file in sorted(work_dir.glob(f"*/{PID_FILE}")):
        assignment_id = pid_file.parent.name
        try:
            pid_text, _, marked_as = pid_file.read_text().strip().partition(" ")
            pid = int(pid_text)
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (OSError, ValueError):
            environ, marked_as = b"", ""
        name = marked_as or assignment_id
        if f"{MARKER}={name}".encode() in environ.split(b"\0"):
            signal_workload(pid, signal.SIGKILL, sandboxed=False)
            kill_marked(pid_file.parent.with_name(name))
            reaped.append(assignment_id)
            log.warning("killed workload %s left running by a previous agent (pid %d)", assignment_id, pid)
        with contextlib.suppress(OSError):
            pid_file.unlink()
    return reaped
