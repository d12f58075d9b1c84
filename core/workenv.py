"""The environment a workload starts with, wherever it runs: an agent's sandbox
(:func:`agent.runtimes.base.workload_env`) or a pod the Kubernetes dispatcher renders
(:mod:`ops.dispatcher`). One home for the rule, so that both edges tell a workload who it is the same
way (the variables of :mod:`agent.protocol`).

Pure: no I/O, and nothing of the caller's own environment unless it passes it in ``base``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath

from schemas.commands import StartWork

RESERVED_PREFIX = "RESONTECH_"
"""The kernel's namespace: a workload's own ``env`` cannot set these (the agent sets the ones it
gives out; the agent's own NATS and S3 settings live here and are never passed on)."""
CHECKPOINTS = "checkpoints"
"""The folder of the working dir a workload writes checkpoints to (``$RESONTECH_CHECKPOINT_DIR``)."""


def workload_env(
    command: StartWork,
    workdir: PurePosixPath | str,
    *,
    gpu_indices: list[int],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of ``command``'s workload, built from nothing rather than inherited.

    In order (a later entry wins): ``base`` (the agent passes the host's ``PATH`` and ``LANG``; a pod
    keeps its image's), ``HOME`` and ``TMPDIR`` inside ``workdir``, ``PYTHONUNBUFFERED=1``, the
    work's own ``env`` minus the reserved ``RESONTECH_`` names, the workload protocol's variables
    (``RESONTECH_ASSIGNMENT_ID``, ``..._WORK_ID``, ``..._WORK_KIND``, ``..._TENANT``, ``..._SLOT``,
    ``..._EPOCH``, ``..._DATA_ROOT``, ``..._CHECKPOINT_DIR``, and ``..._RESUME_FROM`` when it resumes)
    and ``CUDA_VISIBLE_DEVICES`` (``gpu_indices`` joined; empty for CPU work, so that it sees no GPU).
    """
    root = PurePosixPath(workdir)
    env = {
        **(base or {}),
        "HOME": str(root),
        "TMPDIR": str(root / "tmp"),
        "PYTHONUNBUFFERED": "1",
    }
    env.update({k: v for k, v in command.spec.env.items() if not k.upper().startswith(RESERVED_PREFIX)})
    env.update(
        {
            "RESONTECH_ASSIGNMENT_ID": command.assignment_id,
            "RESONTECH_WORK_ID": command.work_id,
            "RESONTECH_WORK_KIND": command.work_kind,
            "RESONTECH_TENANT": command.tenant,
            "RESONTECH_SLOT": str(command.slot),
            "RESONTECH_EPOCH": str(command.epoch),
            "RESONTECH_DATA_ROOT": str(root / "data"),
            "RESONTECH_CHECKPOINT_DIR": str(root / CHECKPOINTS),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices),
        }
    )
    if command.spec.resume_from:
        env["RESONTECH_RESUME_FROM"] = command.spec.resume_from
    return env
