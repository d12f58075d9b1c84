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
import re
import shutil
import signal
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import BinaryIO

from agent.runtimes.base import StartFailed, checkpoint_dir
from core.files import TenantTree, UnsafeFile
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
_NAME = re.compile(r"^[A-Za-z0-9_-]{0,128}$")
"""A name a pid file may give (a folder of the work dir: no ``/``, no ``..``)."""


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


def fresh_workdir(workdir: Path) -> None:
    """Give an assignment an empty working dir of its own before anything is written in it.

    Whatever is at ``workdir`` already (an earlier run of the same assignment id, before an agent
    restart, or a folder its workload left) was written by tenant code: the agent's downloads, the
    resume checkpoint and an NVFlare kit's unpacking write by path before the workload starts, and a
    link planted there would take those writes out of the tree. So it is removed first, never
    followed: a link or file is unlinked, a folder removed by :func:`shutil.rmtree`, which walks by
    directory fd and unlinks links without following them. The work root is the agent's own (no
    workload writes it), so the new folder is the agent's until the workload starts in it.

    Raises:
        StartFailed: it cannot be removed or made (the message says why).
    """
    try:
        if workdir.is_symlink() or (workdir.exists() and not workdir.is_dir()):
            workdir.unlink()
        elif workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(mode=0o700, parents=True)
    except OSError as exc:
        raise StartFailed(f"the working dir cannot be made fresh: {exc.strerror or exc}") from None


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
    try:  # before the workload runs: it may later put links in place of the folder's names
        tree = TenantTree.open(workdir)
        sink = tree.open_write(LOG_FILE, append=True)
    except (UnsafeFile, OSError) as exc:
        sandbox.release(name)
        raise StartFailed(f"cannot use the working directory: {getattr(exc, 'message', exc)}") from None
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
        sink.close()
        tree.close()
        raise StartFailed(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    _write_pid(tree, str(proc.pid))
    return (workload or ProcessWorkload)(proc, workdir, sandbox, tree, sink)


def _write_pid(tree: TenantTree, text: str) -> None:
    """Write the pid file beneath the held folder (a link the workload put there is refused)."""
    try:
        tree.write_bytes(PID_FILE, text.encode())
    except (UnsafeFile, OSError) as exc:
        log.warning("%s: no pid file: %s", tree.path.name, getattr(exc, "message", exc))


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

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        workdir: Path,
        sandbox: Sandbox,
        tree: TenantTree,
        sink: BinaryIO,
    ) -> None:
        self._proc = proc
        self.workdir = workdir
        self.sandbox = sandbox
        # the working dir, held since before the workload started, and its log, opened then: the
        # workload writes the folder, so its names are read (and written) only beneath this fd
        self.tree = tree
        self._sink = sink
        self.log_path = workdir / LOG_FILE
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
            with self._sink as sink:
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
        with contextlib.suppress(OSError, UnsafeFile):
            self.tree.unlink(PID_FILE)
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
        _write_pid(self.tree, f"{self._proc.pid} {self.workdir.name}")  # the fd moved with the folder

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
        return log_tail(self.tree, n)


def log_tail(tree: TenantTree, n: int = 40) -> str:
    """The last ``n`` lines of the workload's log (empty if unreadable), from at most its last 64 KiB.
    Read beneath the held working dir and never through a link: the tail goes into the job's
    failure, which the tenant reads."""
    try:
        text = tree.tail_bytes(LOG_FILE, 65_536).decode(errors="replace")
    except (OSError, UnsafeFile):
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
    found = _folders(work_dir)
    for folder in list(found):
        _, marked_as = read_pid_file(folder)
        if marked_as:
            found.append(work_dir / marked_as)
    return found


def _folders(work_dir: Path) -> list[Path]:
    """The folders (not links) directly in ``work_dir``."""
    if not work_dir.is_dir():
        return []
    return [d for d in work_dir.iterdir() if d.is_dir() and not d.is_symlink()]


def read_pid_file(folder: Path) -> tuple[int | None, str]:
    """The pid and the name it was marked with (``""``: the folder's own) that ``folder``'s pid file
    gives, read beneath the folder without following links and bounded; ``(None, "")`` when there is
    none or it is not one (the workload writes the folder: it is a claim, checked against the
    process's environment before anything is killed)."""
    try:
        with TenantTree.open(folder) as tree:
            text = tree.read_bytes(PID_FILE, 200).decode()
        pid_text, _, marked_as = text.strip().partition(" ")
        pid = int(pid_text)
    except (OSError, UnsafeFile, ValueError):
        return None, ""
    if pid <= 0 or not _NAME.match(marked_as):
        return None, ""
    return pid, marked_as


def reap_orphans(work_dir: Path) -> list[str]:
    """Kill workloads a previous run of the agent left running; return their assignment ids.

    A process counts as ours only if its environment still names the assignment (so a recycled pid
    is never killed): the folder's name, or the name the pid file gives after the pid (a warm engine
    started under its own name, :meth:`ProcessWorkload.moved_to`).
    """
    reaped = []
    for folder in sorted(_folders(work_dir)):
        assignment_id = folder.name
        pid, marked_as = read_pid_file(folder)
        if pid is None:
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            environ = b""
        name = marked_as or assignment_id
        if f"{MARKER}={name}".encode() in environ.split(b"\0"):
            signal_workload(pid, signal.SIGKILL, sandboxed=False)
            kill_marked(folder.with_name(name))
            reaped.append(assignment_id)
            log.warning("killed workload %s left running by a previous agent (pid %d)", assignment_id, pid)
        with contextlib.suppress(OSError, UnsafeFile), TenantTree.open(folder) as tree:
            tree.unlink(PID_FILE)
    return reaped
