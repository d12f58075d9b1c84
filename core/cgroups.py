"""A cgroup per workload, where the host lets the agent make one: memory and process limits that hold.

A workload's limits (:class:`Limits`) are enforced by the kernel's cgroups when the agent runs in a
cgroup it may write to, and by rlimits otherwise (:mod:`core.sandbox` applies both). rlimits are a
weaker fence: ``RLIMIT_DATA`` bounds each process's heap, not the sum over its children, and
``RLIMIT_NPROC`` counts every process of the agent's user (and does not bind root at all), where a
cgroup bounds the workload's whole tree, page cache and shared memory included.

Two layouts are found:

* **cgroup v2** (systemd hosts): the agent's own cgroup (``0::<path>`` in ``/proc/self/cgroup``)
  delegated to it (``Delegate=yes`` in its unit, or a container's private cgroup), with ``memory``
  and ``pids`` available. cgroup v2 forbids processes in a cgroup whose children get controllers,
  so the agent first moves itself into a leaf ``<own>/agent``, then enables ``+memory +pids`` for
  the children. Each workload gets ``<own>/<assignment>`` with ``memory.max``, ``memory.swap.max``
  (0: a limit that swap can evade is no limit) and ``pids.max``.
* **cgroup v1** (older hosts, and this project's test machine): the agent's ``memory`` and ``pids``
  cgroups writable by it. Each workload gets ``<own>/<assignment>`` in both, with
  ``memory.limit_in_bytes`` and ``pids.max``.

The workload's first process joins its cgroups before it executes anything (``join``, run in the
child between fork and exec), so nothing it starts escapes them. When the workload ends, the agent
kills what is left in them and removes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("resontech.agent")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "resontech-"


@dataclass(frozen=True, slots=True)
class Limits:
    """What one workload may use.

    Attributes:
        memory_mb: memory of the whole workload, MiB (0: no limit of its own).
        processes: processes and threads of the whole workload.
        open_files: open files per process.
    """

    memory_mb: int = 0
    processes: int = 4096
    open_files: int = 65_536


@dataclass(frozen=True, slots=True)
class Cgroups:
    """Where this agent makes its workloads' cgroups.

    Attributes:
        version: 1 or 2.
        parents: the directories the workload cgroups are made in (v2: one; v1: memory's and pids').
    """

    version: int
    parents: tuple[Path, ...]

    @property
    def kind(self) -> str:
        """``cgroup v2`` or ``cgroup v1``, for the registration and the logs."""
        return f"cgroup v{self.version}"

    def create(self, name: str, limits: Limits) -> tuple[Path, ...]:
        """Make the cgroups of workload ``name`` with ``limits``; returns their ``cgroup.procs`` files.

        Raises:
            OSError: the cgroups cannot be made or limited.
        """
        dirs = tuple(parent / (PREFIX + name) for parent in self.parents)
        for d in dirs:
            d.mkdir(exist_ok=True)
        memory = str(limits.memory_mb * 1024 * 1024) if limits.memory_mb else None
        if self.version == 2:
            [d] = dirs
            (d / "pids.max").write_text(str(limits.processes))
            if memory is not None:
                (d / "memory.max").write_text(memory)
                with contextlib.suppress(FileNotFoundError):  # no swap accounting on this kernel
                    (d / "memory.swap.max").write_text("0")
        else:
            memory_dir, pids_dir = dirs
            (pids_dir / "pids.max").write_text(str(limits.processes))
            if memory is not None:
                (memory_dir / "memory.limit_in_bytes").write_text(memory)
        return tuple(d / "cgroup.procs" for d in dirs)

    def remove(self, name: str) -> None:
        """Kill whatever is still in workload ``name``'s cgroups, then remove them."""
        for parent in self.parents:
            d = parent / (PREFIX + name)
            if not d.is_dir():
                continue
            for _ in range(50):
                pids = _members(d)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)
            try:
                d.rmdir()
            except OSError as exc:
                log.warning("cannot remove cgroup %s: %s", d, exc.strerror or exc)

    def peak_memory_mb(self, name: str) -> int | None:
        """The most memory workload ``name`` used so far, MiB (``None`` if unknown)."""
        file = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.parents[0] / (PREFIX + name) / file).read_text()) // (1024 * 1024)
        except (OSError, ValueError):
            return None


def join(procs_files: tuple[Path, ...]) -> None:
    """Move the calling process into the cgroups whose ``cgroup.procs`` files are given (in a
    workload's child, before it executes its command)."""
    pid = str(os.getpid())
    for procs in procs_files:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, pid.encode())
        finally:
            os.close(fd)


def detect() -> Cgroups | None:
    """The cgroups this agent may make workload cgroups in, or ``None`` (rlimits only)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    own: dict[str, str] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return _v2(own.get("")) or _v1(own.get("memory"), own.get("pids"))


def _v2(path: str | None) -> Cgroups | None:
    mount = _mount_of("cgroup2")
    if path is None or mount is None:
        return None
    own = mount / path.lstrip("/")
    try:
        available = set((own / "cgroup.controllers").read_text().split())
        if not {"memory", "pids"} <= available or not os.access(own / "cgroup.subtree_control", os.W_OK):
            return None
        enabled = set((own / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            # No processes may stay in a cgroup whose children get controllers: the agent (and
            # anything else in its cgroup) moves to a leaf of its own first.
            leaf = own / "agent"
            leaf.mkdir(exist_ok=True)
            for pid in _members(own):
                with contextlib.suppress(ProcessLookupError):
                    (leaf / "cgroup.procs").write_text(str(pid))
            (own / "cgroup.subtree_control").write_text("+memory +pids")
        return _probe(Cgroups(2, (own,)))
    except OSError:
        return None


def _v1(memory: str | None, pids: str | None) -> Cgroups | None:
    if memory is None or pids is None:
        return None
    parents = (CGROUP_ROOT / "memory" / memory.lstrip("/"), CGROUP_ROOT / "pids" / pids.lstrip("/"))
    if not all(os.access(p, os.W_OK) for p in parents):
        return None
    return _probe(Cgroups(1, parents))


def _probe(cgroups: Cgroups) -> Cgroups | None:
    """``cgroups`` if a workload cgroup can really be made, limited and removed there."""
    name = f"probe-{os.getpid()}"
    try:
        cgroups.create(name, Limits(memory_mb=64, processes=16))
    except OSError:
        cgroups.remove(name)
        return None
    cgroups.remove(name)
    return cgroups


def _mount_of(fstype: str) -> Path | None:
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == fstype:
                return Path(left.split()[4])
    except OSError:
        pass
    return None


def _members(d: Path) -> list[int]:
    try:
        return [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []
