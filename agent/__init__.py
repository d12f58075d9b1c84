"""The worker agent that runs on a GPU provider's host (``resontech agent``).

It registers the host, heartbeats with telemetry, takes commands from its durable queue, decides
them with the provider's policy, runs workloads through runtimes, and reports progress, checkpoints,
completion, failure and usage as events. See :mod:`agent.service` for its life cycle and
:mod:`agent.protocol` for how a workload talks to it.

The names below are re-exported lazily, so that importing :mod:`agent.cli` (every ``resontech``
command does, to build its parser) does not import NATS and the whole agent.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Agent": "agent.service",
    "AgentSettings": "agent.settings",
    "load_agent_settings": "agent.settings",
    "run_agent": "agent.cli",
    "SimulatedFleet": "agent.simulated",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
