"""Processes found by the marks in their environment: children inherit their parent's environment,
whatever session or process group they move to, so a tag set on a tree's root finds the whole tree.

The agent finds a workload's processes by its assignment's marks (:func:`agent.runtimes.process.kill_marked`);
the kernel finds an FL server's by its ``RESONTECH_FEDERATION`` tag. Only processes this user may read
are seen, which is every process the caller started.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def marked(pid: str, marks: set[bytes]) -> bool:
    """Whether process ``pid``'s environment holds every one of ``marks`` (``NAME=value``)."""
    try:
        return marks <= set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    except OSError:
        return False


def tagged_pids(name: str, value: str) -> list[int]:
    """The processes (but this one) whose environment holds ``name=value``."""
    marks = {f"{name}={value}".encode()}
    return [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and int(pid) != os.getpid() and marked(pid, marks)
    ]


def kill_tagged(name: str, value: str) -> list[int]:
    """SIGKILL every process whose environment holds ``name=value``; return their pids."""
    pids = tagged_pids(name, value)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids
