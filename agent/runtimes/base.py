"""What every runtime provides, and the clean environment every workload starts with.

A runtime turns a :class:`~schemas.commands.WorkSpec` into a running :class:`Workload` in a
per-assignment working directory. The agent drives every workload the same way: it reads its output
lines (the :mod:`agent.protocol` reports among them), waits for its exit status, and cancels it with
a grace period. The runtimes (``process``, ``nvflare-client``, ``torchrun``, ``vllm``) are in
:data:`agent.runtimes.RUNTIMES`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Protocol

from core import workenv
from core.errors import ResontechError
from core.workenv import RESERVED_PREFIX as RESERVED_PREFIX  # warm.py reads it here
from schemas.commands import StartWork, WorkSpec

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class StartFailed(ResontechError):
    """A workload could not be started (empty command, missing executable, unknown runtime).

    Attributes:
        retryable: not the work's fault (a rendezvous port taken on this host): place it again.
    """

    code = "start_failed"

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class Workload(Protocol):
    """A started workload."""

    @property
    def pid(self) -> int | None:
        """The main process id, if the workload is a local process."""
        ...

    @property
    def returncode(self) -> int | None:
        """The exit status once it has exited (negative: killed by that signal), else ``None``."""
        ...

    def lines(self) -> AsyncIterator[str]:
        """Its output (stdout and stderr), line by line without the newline, until it closes."""
        ...

    async def wait(self) -> int:
        """Wait for the exit and return the exit status."""
        ...

    async def cancel(self, grace_s: float) -> int:
        """SIGTERM, then SIGKILL after ``grace_s`` seconds; return the exit status."""
        ...

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of its captured log."""
        ...


class Runtime(Protocol):
    """Starts workloads of one kind."""

    async def start(self, spec: WorkSpec, workdir: Path, env: Mapping[str, str]) -> Workload:
        """Start ``spec`` in ``workdir`` with exactly ``env`` as its environment.

        Raises:
            StartFailed: it could not start; the message says why in one line.
        """
        ...


def checkpoint_dir(workdir: Path) -> Path:
    """Where a workload writes the checkpoints its agent uploads (``$RESONTECH_CHECKPOINT_DIR``)."""
    return workdir / workenv.CHECKPOINTS


def workload_env(
    command: StartWork,
    workdir: Path,
    *,
    gpu_indices: list[int],
    host_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a workload, built from nothing rather than inherited: ``PATH`` and ``LANG``
    from the host, then :func:`core.workenv.workload_env` (``HOME`` and ``TMPDIR`` inside ``workdir``,
    the work's own ``env`` minus the reserved ``RESONTECH_`` names, the workload protocol's variables
    (see :mod:`agent.protocol`; the runtime adds ``RESONTECH_RESUME_PATH`` when it fetched the
    checkpoint) and ``CUDA_VISIBLE_DEVICES``, empty for CPU work, so that it sees no GPU). Never the
    agent's NATS credentials, S3 keys or anything else of its environment.
    """
    return workenv.workload_env(command, str(workdir), gpu_indices=gpu_indices, base=host_base(host_env))


def host_base(host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a workload takes of the host's environment: ``PATH`` and ``LANG``, nothing else."""
    host = os.environ if host_env is None else host_env
    return {"PATH": host.get("PATH") or DEFAULT_PATH, "LANG": host.get("LANG") or "C.UTF-8"}
