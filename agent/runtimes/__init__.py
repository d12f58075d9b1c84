"""Workload runtimes, by the name a ``WorkSpec.runtime`` gives.

``process`` runs a command; ``nvflare-client`` runs an NVFlare client of a federated job. Later issues
add ``torchrun``, ``vllm`` and ``cpu-engine`` here.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.runtimes.base import Runtime, StartFailed, Workload, workload_env
from agent.runtimes.nvflare import NvflareClientRuntime
from agent.runtimes.process import ProcessRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "process": ProcessRuntime,
    "nvflare-client": NvflareClientRuntime,
}
"""Runtime name -> factory."""

__all__ = [
    "RUNTIMES",
    "NvflareClientRuntime",
    "ProcessRuntime",
    "Runtime",
    "StartFailed",
    "Workload",
    "workload_env",
]
