"""Workload runtimes, by the name a ``WorkSpec.runtime`` gives.

Later issues add ``nvflare-client``, ``torchrun``, ``vllm`` and ``cpu-engine`` here.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.runtimes.base import Runtime, StartFailed, Workload, workload_env
from agent.runtimes.process import ProcessRuntime
from agent.runtimes.vllm import VllmRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {"process": ProcessRuntime, "vllm": VllmRuntime}
"""Runtime name -> factory."""

__all__ = ["RUNTIMES", "ProcessRuntime", "Runtime", "VllmRuntime", "StartFailed", "Workload", "workload_env"]
