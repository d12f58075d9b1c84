"""Workload runtimes, by the name a ``WorkSpec.runtime`` gives.

Later issues add ``nvflare-client`` here.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.runtimes.base import Runtime, StartFailed, Workload, checkpoint_dir, workload_env
from agent.runtimes.process import ProcessRuntime
from agent.runtimes.torchrun import TorchrunRuntime
from agent.runtimes.vllm import VllmRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "process": ProcessRuntime,
    "torchrun": TorchrunRuntime,
    "vllm": VllmRuntime,
}
"""Runtime name -> factory."""

__all__ = [
    "RUNTIMES",
    "ProcessRuntime",
    "Runtime",
    "StartFailed",
    "TorchrunRuntime",
    "VllmRuntime",
    "Workload",
    "checkpoint_dir",
    "workload_env",
]
