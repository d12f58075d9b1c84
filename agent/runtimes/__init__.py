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
from core.sandbox import Sandbox

RUNTIMES: dict[str, Callable[[Sandbox], Runtime]] = {
    "process": ProcessRuntime,
    "torchrun": TorchrunRuntime,
    "nvflare-client": NvflareClientRuntime,
    "vllm": VllmRuntime,
}
"""Runtime name -> factory, given the host's sandbox (:mod:`core.sandbox`)."""

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
