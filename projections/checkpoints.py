"""Sharded checkpoints: where a node's parts go, and when a set of parts is a checkpoint.

A ``ddp`` job whose ranks save with ``torch.distributed.checkpoint`` (DCP) leaves each node with the
files of its own ranks. Each node's agent uploads them as one part (an archive,
:mod:`agent.checkpoint_parts`) to the next of its presigned keys (:func:`part_keys`) and reports
``job.checkpoint_part_stored``. A checkpoint counts only when every node's part of one step is stored
(:func:`completed`): then the coordinator appends ``job.checkpointed`` naming the set, and a restart
resumes from it, on any number of nodes (every node downloads every part; DCP reshards on load).

Keys: ``jobs/<name>/checkpoints/<job_id>/e<epoch>-<n>/node-<slot>.tar`` for ``n`` in
``0 .. PART_SLOTS-1``. A node takes them in turn, counting every save it is told of (uploaded or
not), so the nodes of one world stay in step: save ``k`` of a placement lies in folder ``k mod
PART_SLOTS`` on every node. With three folders, the last complete set is overwritten only after two
saves in a row failed to complete; the agent that resumes checks each part's manifest (its step), so
a set mixed by such an overwrite is refused at resume, never loaded.

Pure: no I/O.
"""

from __future__ import annotations

import re

from projections.schedule import JobRecord
from schemas.jobs import JobCheckpointed

PART_SLOTS = 3
"""Folders a placement's parts rotate through (see the module docstring)."""


def checkpoint_prefix(job: JobRecord) -> str:
    """Where an agent may report ``job``'s checkpoints."""
    return f"jobs/{job.spec.name}/checkpoints/{job.job_id}/"


def part_folder(job: JobRecord, epoch: int, n: int) -> str:
    """The folder of the ``n``-th rotation of placement ``epoch``'s parts."""
    return f"{checkpoint_prefix(job)}e{epoch}-{n}/"


def part_keys(job: JobRecord, epoch: int, slot: int) -> list[str]:
    """The keys node ``slot`` of placement ``epoch`` uploads its parts to, in turn."""
    return [f"{part_folder(job, epoch, n)}node-{slot}.tar" for n in range(PART_SLOTS)]


_PART = re.compile(r"^(?P<folder>.+/)node-(?P<slot>[0-9]+)\.tar$")


def completed(job: JobRecord) -> JobCheckpointed | None:
    """The kernel's ``job.checkpointed`` for the newest complete set of parts newer than the job's
    last checkpoint, or ``None``.

    A set is complete when every node (``0 .. shards-1``) has stored its part of one step at the
    current epoch, all in one folder (nodes that disagree on the rotation never complete a set).
    """
    newest: JobCheckpointed | None = None
    shards = job.spec.shards
    for step, parts in job.checkpoint_parts.items():
        if len(parts) != shards or (newest is not None and int(step) <= (newest.step or 0)):
            continue
        keys = [parts.get(str(slot), "") for slot in range(shards)]
        folders = {m.group("folder") if (m := _PART.match(key)) else "" for key in keys}
        if len(folders) != 1 or "" in folders:
            continue
        [folder] = folders
        newest = JobCheckpointed(epoch=job.epoch, object_key=folder, step=int(step), parts=keys)
    return newest


__all__ = ["PART_SLOTS", "checkpoint_prefix", "completed", "part_folder", "part_keys"]
