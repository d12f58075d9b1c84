"""The workload protocol, as the agent reads it: the parser lives in :mod:`core.protocol` (pure, shared
with the Kubernetes dispatcher, which reads the same lines from a pod's log); see it for the lines a
workload prints and the environment it starts with."""

from __future__ import annotations

from core.protocol import (
    CHECKPOINT,
    KEYWORD_PREFIX,
    LINE_LIMIT,
    PROGRESS,
    READY,
    CheckpointLine,
    ProgressLine,
    ProtocolError,
    ReadyLine,
    Report,
    parse_line,
)

__all__ = [
    "CHECKPOINT",
    "KEYWORD_PREFIX",
    "LINE_LIMIT",
    "PROGRESS",
    "READY",
    "CheckpointLine",
    "ProgressLine",
    "ProtocolError",
    "ReadyLine",
    "Report",
    "parse_line",
]
