"""Workload runtimes, by the name a ``WorkSpec.runtime`` gives.

Later issues add ``nvflare-client``, ``torchrun``, ``vllm`` and ``cpu-engine`` here.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.runtimes.base import Runtime, StartFailed, Workload, workload_env
from agent.runtimes.process import ProcessRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {"process": ProcessRuntime}
"""Runtime name -> factory."""

__all__ = ["RUNTIMES", "ProcessRuntime", "Runtime", "StartFailed", "Workload", "workload_env"]
