"""Workload runtimes, by the name a ``WorkSpec.runtime`` gives.

``process`` runs a command, ``torchrun`` a DDP node, ``nvflare-client`` an NVFlare client of a
federated job, ``vllm`` an inference engine for an endpoint replica.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.runtimes.base import Runtime, StartFailed, Workload, checkpoint_dir, workload_env
from agent.runtimes.nvflare import NvflareClientRuntime
from agent.runtimes.process import ProcessRuntime
from agent.runtimes.torchrun import TorchrunRuntime
from agent.runtimes.vllm import VllmRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "process": ProcessRuntime,
    "torchrun": TorchrunRuntime,
    "nvflare-client": NvflareClientRuntime,
    "vllm": VllmRuntime,
}
"""Runtime name -> factory."""

__all__ = [
    "RUNTIMES",
    "NvflareClientRuntime",
    "ProcessRuntime",
    "Runtime",
    "StartFailed",
    "TorchrunRuntime",
    "VllmRuntime",
    "Workload",
    "checkpoint_dir",
    "workload_env",
]
