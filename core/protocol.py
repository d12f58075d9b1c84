"""The workload protocol: how a running workload talks to its agent, by printing lines on stdout.

A line that starts with one of these keywords, a space and a JSON object becomes an event; every
other line is just log output. All fields are optional unless marked.

``RESONTECH_PROGRESS {"round": 1, "train_epoch": 1, "step": 10, "loss": 0.5, "metrics": {"acc": 0.9}}``
    -> ``job.<tenant>.<job>.progress`` (``JobProgress``), stamped with the assignment's epoch and slot.
    ``gpu_util_pct`` may be given too.
``RESONTECH_CHECKPOINT {"path": "epoch-0004.pt", "step": 300}``
    -> the agent uploads the file ``path`` of ``$RESONTECH_CHECKPOINT_DIR`` to the workspace through
    the presigned URLs of its assignment (``WorkSpec.checkpoint_urls``), then appends
    ``job.<tenant>.<job>.checkpointed`` (``JobCheckpointed``) with the key it went to; a restart
    resumes from it (``WorkSpec.resume_from``, fetched to ``$RESONTECH_RESUME_PATH``). Write each
    checkpoint under a new name, completely (to a temporary name, then rename), before printing the
    line: the agent removes the file once uploaded.
``RESONTECH_CHECKPOINT {"object_key": "jobs/x/ckpt/round-3.pt", "round": 3, "step": 300}``
    -> the same event for a checkpoint the workload has already written to the tenant's workspace
    itself, under that key.
``RESONTECH_CHECKPOINT {"dir": "step-000300", "step": 300}`` (``step`` required)
    -> this node's part of a sharded checkpoint: the plain files directly in the folder ``dir`` of
    ``$RESONTECH_CHECKPOINT_DIR`` (what this node's ranks wrote with ``torch.distributed.checkpoint``)
    go up as one archive through the node's presigned URLs (``WorkSpec.part_urls``), and the agent
    appends ``job.<tenant>.<job>.checkpoint_part_stored``; the checkpoint counts once every node's
    part of the step is stored (see :mod:`agent.checkpoints`). One line per node: its local rank 0
    prints it once the save has finished on every rank.

Exactly one of ``path``, ``dir`` and ``object_key`` is given.
``RESONTECH_READY {"address": "http://10.0.0.5:8000", "api_key": "..."}``
    -> ``endpoint.<tenant>.<endpoint>.replica_ready`` for an inference replica (``address`` required;
    ``api_key``: the key the engine takes). Only the ``vllm`` runtime says it, for its engine (see
    :mod:`agent.runtimes.vllm`): a line the engine itself prints never reaches the agent.

The environment a workload starts with (see :mod:`agent.runtimes.process`) tells it who it is:
``RESONTECH_ASSIGNMENT_ID``, ``RESONTECH_WORK_ID``, ``RESONTECH_SLOT``, ``RESONTECH_EPOCH``,
``RESONTECH_DATA_ROOT`` (``<workdir>/data``), ``RESONTECH_CHECKPOINT_DIR`` (``<workdir>/checkpoints``),
``RESONTECH_RESUME_FROM`` and ``RESONTECH_RESUME_PATH`` (the checkpoint to resume from: its key, and
the local file when the runtime fetched it), and ``PYTHONUNBUFFERED=1`` so that Python workloads'
lines arrive as they are printed. On ``SIGTERM`` (a ``StopWork``, a preemption with checkpoint, or the
agent stopping) a workload has the agent's grace period to write a checkpoint, print its
``RESONTECH_CHECKPOINT`` line and exit; then it is killed.

A malformed protocol line is logged by the agent and otherwise ignored: it never stops the workload.
A line longer than :data:`LINE_LIMIT` is read in pieces, none of which is a report.

The parser is pure and shared by both edges that read workloads' output: the agent
(:mod:`agent.forwarding`) and the Kubernetes dispatcher (:mod:`ops.dispatcher.reporting`), which reads
the same lines from a pod's log.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core.errors import ResontechError

KEYWORD_PREFIX = "RESONTECH_"
"""Every keyword starts with it: a line that does not is ordinary output."""
PROGRESS = "RESONTECH_PROGRESS"
CHECKPOINT = "RESONTECH_CHECKPOINT"
READY = "RESONTECH_READY"
LINE_LIMIT = 1024 * 1024
"""Longest output line read whole, in bytes; a longer one is taken in pieces (never a report)."""


class ProgressLine(msgspec.Struct, frozen=True, kw_only=True):
    """A ``RESONTECH_PROGRESS`` report."""

    round: int | None = None
    train_epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    metrics: dict[str, float] = {}
    gpu_util_pct: float | None = None


class CheckpointLine(msgspec.Struct, frozen=True, kw_only=True):
    """A ``RESONTECH_CHECKPOINT`` report: a file to upload (``path``), a node's part of a sharded
    checkpoint to upload (``dir``), or an object already written (``object_key``). Once the agent has
    uploaded a part, it carries both ``dir`` and the part's ``object_key``: a workload's line never
    may."""

    object_key: str | None = None
    path: str | None = None
    dir: str | None = None
    round: int | None = None
    step: int | None = None


class ReadyLine(msgspec.Struct, frozen=True, kw_only=True):
    """A ``RESONTECH_READY`` report."""

    address: str
    api_key: str = ""


Report = ProgressLine | CheckpointLine | ReadyLine

_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    PROGRESS: msgspec.json.Decoder(ProgressLine),
    CHECKPOINT: msgspec.json.Decoder(CheckpointLine),
    READY: msgspec.json.Decoder(ReadyLine),
}


class ProtocolError(ResontechError, ValueError):
    """A line that starts with a protocol keyword but does not carry a valid report."""

    code = "protocol"


def parse_line(line: str) -> Report | None:
    """The report a stdout line carries, or ``None`` for ordinary output.

    Raises:
        ProtocolError: the line starts with a keyword but its JSON is malformed or of the wrong shape.
    """
    if not line.startswith(KEYWORD_PREFIX):
        return None
    keyword, _, payload = line.strip().partition(" ")
    decoder = _DECODERS.get(keyword)
    if decoder is None:
        return None
    try:
        report: Report = decoder.decode(payload)
    except (msgspec.DecodeError, UnicodeEncodeError) as exc:  # a lone surrogate is not UTF-8 either
        raise ProtocolError(f"{keyword}: {exc}") from None
    if isinstance(report, CheckpointLine):
        if [bool(report.object_key), bool(report.path), bool(report.dir)].count(True) != 1:
            raise ProtocolError(f"{keyword}: give exactly one of path, dir and object_key, not empty")
        if report.dir and report.step is None:
            raise ProtocolError(f"{keyword}: a dir (a part of a sharded checkpoint) needs its step")
    return report
