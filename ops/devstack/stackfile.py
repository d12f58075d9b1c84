"""``stack.json``: what one dev stack runs, so that ``down`` (and a second ``up``) can find it.

One record per data directory, rewritten after every start: whether start-up finished, the
supervising ``up`` (none after a detached one), and every process with its start time, so that a
pid reused by an unrelated process is not taken for ours. :func:`stop_recorded` stops what a record
names and removes it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from core.files import write_private
from ops.process import signal_group

STACK_FILE = "stack.json"
STOP_TIMEOUT_S = 10.0
"""How long a process may take to exit after SIGTERM before it gets SIGKILL."""


def write_state(
    data_dir: Path, *, ready: bool, supervised: bool, processes: Iterable[tuple[str, int, Path]]
) -> None:
    """Record ``processes`` (name, pid, log file) and, if ``supervised``, this process as their
    supervisor."""
    entries = [
        {"name": name, "pid": pid, "started": start_time(pid), "log": str(log)}
        for name, pid, log in processes
    ]
    me = {"pid": os.getpid(), "started": start_time(os.getpid())}
    state = {"ready": ready, "supervisor": me if supervised else None, "processes": entries}
    write_private(data_dir / STACK_FILE, json.dumps(state, indent=2) + "\n")


def read_state(data_dir: Path) -> dict[str, Any] | None:
    """The record in ``data_dir``; None if there is none or it is unreadable."""
    try:
        state = json.loads((data_dir / STACK_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def live(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorded processes (the supervisor first) that still run."""
    return [p for p in [state.get("supervisor"), *state.get("processes", [])] if p and alive(p)]


def stop_recorded(data_dir: Path, timeout: float) -> Literal["stopped", "none", "stale"]:
    """Stop the stack recorded in ``data_dir`` and remove its record.

    A live supervising ``up`` is asked to stop (SIGTERM; it stops everything in order) and given
    ``timeout`` seconds; whatever is left gets SIGTERM, services first, then SIGKILL after
    :data:`STOP_TIMEOUT_S`. ``"none"`` if there is no record, ``"stale"`` if nothing it names runs
    (the record is removed).
    """
    state = read_state(data_dir)
    if state is None:
        return "none"
    supervisor: dict[str, Any] | None = state.get("supervisor")
    processes: list[dict[str, Any]] = state.get("processes", [])
    if not live(state):
        (data_dir / STACK_FILE).unlink(missing_ok=True)
        return "stale"
    if supervisor and alive(supervisor):
        os.kill(supervisor["pid"], signal.SIGTERM)
        wait_gone(supervisor, timeout)
    for proc in reversed(processes):
        if alive(proc):
            signal_group(proc["pid"], signal.SIGTERM)
            if not wait_gone(proc, STOP_TIMEOUT_S):
                signal_group(proc["pid"], signal.SIGKILL)
                wait_gone(proc, STOP_TIMEOUT_S)
    (data_dir / STACK_FILE).unlink(missing_ok=True)
    return "stopped"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), None if it does not exist.

    Recorded with each pid so that a pid reused by an unrelated process is not taken for ours.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else fields[19]  # fields 3 (state) and 22 (starttime)


def alive(proc: dict[str, Any]) -> bool:
    """Whether a recorded process still runs: its pid exists with the recorded start time."""
    pid = proc.get("pid")
    return isinstance(pid, int) and start_time(pid) is not None and start_time(pid) == proc.get("started")


def wait_gone(proc: dict[str, Any], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a recorded process to exit; whether it did."""
    deadline = time.monotonic() + timeout
    while alive(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
