"""Host CPU and memory, read from ``/proc`` (Linux); no psutil. And the address peers reach it at.

On a system without ``/proc`` every reading is 0 rather than an error: the agent still runs.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from core.cgroups import detect
from core.sandbox import Sandbox, problem

if TYPE_CHECKING:
    from agent.settings import AgentSettings

PROC = Path("/proc")


def cpu_count() -> int:
    """CPUs this process may run on (its affinity set), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _meminfo(proc: Path = PROC) -> dict[str, int]:
    """``/proc/meminfo`` in KiB by field name (empty if unreadable)."""
    out: dict[str, int] = {}
    try:
        text = (proc / "meminfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0])
    return out


def memory_total_mb(proc: Path = PROC) -> int:
    """Total host memory in MiB (0 if unknown)."""
    return _meminfo(proc).get("MemTotal", 0) // 1024


def memory_used_mb(proc: Path = PROC) -> int:
    """Memory in use in MiB: total minus available (0 if unknown)."""
    info = _meminfo(proc)
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", info.get("MemFree", 0))
    return max(0, total - available) // 1024


class CpuLoad:
    """Host CPU utilisation between two readings of ``/proc/stat``, in percent (0-100)."""

    def __init__(self, proc: Path = PROC) -> None:
        self._proc = proc
        self._last = self._read()

    def _read(self) -> tuple[int, int]:
        """(busy, total) jiffies since boot, or (0, 0)."""
        try:
            with (self._proc / "stat").open() as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        total = sum(fields[:8])  # guest time is already counted in user/nice
        return total - idle, total

    def percent(self) -> float:
        """Utilisation since the previous call (or since construction), rounded to 0.1."""
        busy, total = self._read()
        last_busy, last_total = self._last
        self._last = (busy, total)
        if total <= last_total:
            return 0.0
        return round(100.0 * (busy - last_busy) / (total - last_total), 1)


def route_address(url: str) -> str:
    """The local address this host reaches ``url``'s host from (the first URL of a comma-separated
    list): the interface other hosts of the fleet most likely reach it at too. Loopback for a
    loopback server; the host name when there is no route. No packet is sent (a UDP "connect" only
    picks the route).
    """
    parsed = urlsplit(url.split(",")[0].strip())
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((parsed.hostname or "127.0.0.1", parsed.port or 4222))
            address: str = probe.getsockname()[0]
            return address
    except OSError:
        return socket.gethostname()


def host_sandbox(settings: AgentSettings) -> tuple[Sandbox, str | None]:
    """The sandbox an agent with ``settings`` runs workloads in, and why it cannot start here
    (``None``: it can; always ``None`` unsandboxed).

    Beside the model cache, the host's Hugging Face hub cache is read-only in it (its snapshots link
    to its blobs: the engine is given a snapshot folder; see :mod:`agent.hub_cache`), unless that
    directory would hold the agent's own state, which no workload may see."""
    from agent.hub_cache import hub_cache
    from agent.models import model_cache

    sandbox = Sandbox.for_host(
        enabled=not settings.unsandboxed,
        model_cache=model_cache(),
        cgroups=detect(),
        processes=settings.max_processes,
        open_files=settings.max_open_files,
    )
    hub = hub_cache().absolute()
    if not any(Path(p).absolute().is_relative_to(hub) for p in (settings.state_dir, settings.work_dir)):
        sandbox = replace(sandbox, read_only=(*sandbox.read_only, hub))
    return sandbox, None if settings.unsandboxed else problem(sandbox)
