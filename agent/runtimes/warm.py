"""Warm engines: vLLM servers started ahead of the replicas they will serve, on CPU hosts.

A replica of vLLM-CPU spends most of its cold start importing torch and vLLM (8 to 11 s of a core on
this project's reference host, before any work of its own). An agent with ``warm_engines`` N keeps N
engines that have done it already: each is the program :mod:`agent.engines.warm`, started in a
sandbox of its own like any workload, with no model, no tenant and no port, waiting for one command
on a pipe only the agent holds. A replica's start takes one (:meth:`WarmEngines.take`): its inputs
move into the engine's directory, which then takes the assignment's name (:func:`adopt`), and the
agent writes the command. From then on the engine *is* that replica: metered, stopped and cleaned up
as it is, and never used again. The agent starts the next warm engine once the replica that took one
is serving (or gone), so that the imports never compete with the start they are meant to speed up.

Isolation is a workload's, unchanged: one sandbox per engine, entered before any tenant's bytes exist
in it; an engine is used for one replica, so nothing of one tenant's can reach another's. What it is
not: a sleeping replica. It holds no model and belongs to no tenant; its cost (about 0.65 GB of
memory and 9 s of a core per start, idle otherwise) is the provider's, who chooses to keep it, like
any other readiness the host keeps (the README's "Cold starts" says more).

Only CPU replicas use one: a GPU replica's sandbox holds its own GPUs' device nodes, which a sandbox
made before the assignment cannot know. Nor does a replica with a memory limit of its own (the warm
engine's limits are the host's defaults).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.runtimes.base import RESERVED_PREFIX, StartFailed, host_base
from agent.runtimes.process import MARKER, ProcessWorkload, prepare, spawn
from core.files import TenantTree, UnsafeFile
from core.sandbox import Sandbox
from schemas.commands import WorkSpec

log = logging.getLogger("resontech.agent")
PROGRAM = "agent.engines.warm"
NAME_PREFIX = "warm-"
"""A warm engine's directory (in the agent's work dir) until a replica takes it."""
RETIRE_S = 5.0


@dataclass(frozen=True, slots=True)
class WarmEngine:
    """A started engine waiting for its command.

    Attributes:
        workdir: its directory, and its sandbox's only writable place, at this path for its life.
        workload: the process.
    """

    workdir: Path
    workload: ProcessWorkload


def warm_command() -> list[str]:
    """The argv of a warm engine."""
    return [sys.executable, "-m", PROGRAM]


def start_env(
    workdir: Path, engine_env: Mapping[str, str], host_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A warm engine's own environment: a clean one in ``workdir`` (its ``HOME`` and the
    ``RESONTECH_ASSIGNMENT_ID`` mark carry the directory's name, as a workload's do) plus
    ``engine_env``, which must hold what libraries read when torch is imported (OpenMP's)."""
    env = {
        **host_base(host_env),
        "HOME": str(workdir),
        "TMPDIR": str(workdir / "tmp"),
        "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": "",
        **{k: v for k, v in engine_env.items() if not k.startswith(RESERVED_PREFIX)},
    }
    env[MARKER] = workdir.name
    return env


def adopt(engine_dir: Path, workdir: Path) -> None:
    """Give ``engine_dir`` the name ``workdir`` with ``workdir``'s contents (the inputs fetched for
    the assignment) moved in: the engine's sandbox, bound to the directory itself, sees them at its own
    path, while the agent keeps finding the assignment where it always does.

    The engine's directory is written by a process in a sandbox, so the merge works beneath directory
    fds taken with ``O_NOFOLLOW`` (:func:`_merge`): a link in it is replaced by what the assignment
    fetched, never followed.

    Raises:
        StartFailed: either folder is a link or not a folder, or the move failed.
    """
    try:
        if workdir.exists() or workdir.is_symlink():
            with TenantTree.open(workdir) as source, TenantTree.open(engine_dir) as target:
                _merge(source.fd, target.fd)
            workdir.rmdir()
        engine_dir.rename(workdir)
    except (UnsafeFile, OSError) as exc:
        why = exc.message if isinstance(exc, UnsafeFile) else exc.strerror or str(exc)
        raise StartFailed(f"the warm engine cannot take the assignment's folder: {why}") from None


def _merge(source: int, target: int) -> None:
    """Move every entry of the folder ``source`` into the folder ``target`` (both fds; folders
    merged), each name beneath its folder's fd: a link in ``target`` (at any depth) is replaced, a
    link never followed; ``source`` is left empty."""
    for name in os.listdir(source):
        here = os.stat(name, dir_fd=source, follow_symlinks=False)
        try:
            there: os.stat_result | None = os.stat(name, dir_fd=target, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        if there is not None and stat.S_ISDIR(here.st_mode) and stat.S_ISDIR(there.st_mode):
            inner = os.open(name, _FOLDER, dir_fd=source)
            try:
                into = os.open(name, _FOLDER, dir_fd=target)
                try:
                    _merge(inner, into)
                finally:
                    os.close(into)
            finally:
                os.close(inner)
            os.rmdir(name, dir_fd=source)
            continue
        if there is not None and stat.S_ISDIR(there.st_mode):
            shutil.rmtree(name, dir_fd=target)  # by fd, links inside unlinked, never followed
        elif there is not None and stat.S_ISDIR(here.st_mode):
            os.unlink(name, dir_fd=target)  # a file or a link where the folder goes
        os.rename(name, name, src_dir_fd=source, dst_dir_fd=target)


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def seen_from(path_or_value: str, workdir: Path, engine_dir: Path) -> str:
    """A path under ``workdir`` as the adopted engine's sandbox sees it (under ``engine_dir``);
    anything else unchanged."""
    outer = str(workdir)
    if path_or_value == outer or path_or_value.startswith(outer + "/"):
        return str(engine_dir) + path_or_value[len(outer) :]
    return path_or_value


def remove_leftovers(work_dir: Path) -> None:
    """Remove the folders of warm engines a previous run of the agent left (their processes are gone:
    :func:`agent.runtimes.process.reap_orphans`)."""
    for folder in work_dir.glob(f"{NAME_PREFIX}*"):
        shutil.rmtree(folder, ignore_errors=True)


class WarmEngines:
    """The warm engines of one agent (see the module docstring).

    Args:
        sandbox: the host's.
        work_dir: the agent's work dir (each engine's directory is made in it).
        count: how many to keep (0: none, and none where vLLM is not installed; every start is cold).
        engine_env: the CPU engine's environment (:func:`agent.runtimes.vllm.engine_env`).
    """

    def __init__(self, sandbox: Sandbox, work_dir: Path, count: int, engine_env: Mapping[str, str]) -> None:
        self.sandbox = sandbox
        self.work_dir = work_dir
        self.count = count if count and importlib.util.find_spec("vllm") else 0
        self.engine_env = dict(engine_env)
        self.ready: list[WarmEngine] = []
        self._starting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def fill(self) -> None:
        """Start engines in the background until :attr:`count` are kept."""
        while not self._closed and len(self.ready) + self._starting < self.count:
            self._starting += 1
            self._spawn(self._start_one())

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_one(self) -> None:
        workdir = self.work_dir / f"{NAME_PREFIX}{secrets.token_hex(6)}"
        try:
            await asyncio.to_thread(prepare, workdir)
            env = start_env(workdir, self.engine_env)
            workload = await spawn(
                warm_command(),
                workdir,
                env,
                sandbox=self.sandbox,
                spec=WorkSpec(runtime="vllm"),
                commands=True,
            )
        except StartFailed as exc:
            log.warning("cannot start a warm engine: %s", exc.message)
            return
        finally:
            self._starting -= 1
        engine = WarmEngine(workdir, workload)
        if self._closed:
            await self._retire(engine)
            return
        self.ready.append(engine)
        log.info("warm engine started in %s (pid %s)", workdir.name, workload.pid)

    def take(self) -> WarmEngine | None:
        """A running engine for a replica to become, or ``None`` (the start is then cold). One that
        died waiting is dropped and replaced; none waiting is not a reason to start one now, beside
        the cold start that needs the cores (the taken one's replacement starts once its replica
        serves: :meth:`refill_after`)."""
        dropped = False
        while self.ready:
            engine = self.ready.pop(0)
            if engine.workload.returncode is None:
                return engine
            log.warning(
                "warm engine %s exited (%s): %s",
                engine.workdir.name,
                engine.workload.returncode,
                engine.workload.log_tail(5),
            )
            self._spawn(self._cleanup(engine))
            dropped = True
        if dropped:
            self.fill()
        return None

    def refill_after(self, settled: Awaitable[object]) -> None:
        """Start the replacement of a taken engine once ``settled`` (its replica serving or gone)."""

        async def later() -> None:
            with contextlib.suppress(Exception):
                await settled
            self.fill()

        self._spawn(later())

    async def _cleanup(self, engine: WarmEngine) -> None:
        await engine.workload.wait()
        await asyncio.to_thread(shutil.rmtree, engine.workdir, True)

    async def _retire(self, engine: WarmEngine) -> None:
        await engine.workload.cancel(RETIRE_S)
        await asyncio.to_thread(shutil.rmtree, engine.workdir, True)

    async def close(self) -> None:
        """Stop every engine not taken (a taken one is its replica's, stopped with it)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        engines, self.ready = self.ready, []
        await asyncio.gather(*(self._retire(e) for e in engines), return_exceptions=True)
