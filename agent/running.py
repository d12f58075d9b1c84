"""The assignments an agent runs now, and the GPUs and VRAM they claim."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agent.reports import EndCause, Meter
from agent.runtimes.base import Workload
from core.files import TenantTree
from schemas.commands import StartWork
from schemas.values import Gpu


@dataclass
class Running:
    """One running assignment.

    Attributes:
        cmd: the command that started it.
        workload: the runtime's handle.
        meter: its usage ticks.
        gpu_indices: the GPUs it holds (``CUDA_VISIBLE_DEVICES``).
        vram_mb: the VRAM it claims, for the policy's VRAM fraction.
        cause: why it ends; ``exited`` unless the agent stops it (see :mod:`agent.reports`).
        task: the task that supervises it.
        checkpoints: its checkpoint folder, held since before it started (its files are read only
            beneath this fd: :class:`core.files.TenantTree`).
    """

    cmd: StartWork
    workload: Workload
    meter: Meter
    gpu_indices: list[int]
    vram_mb: int
    cause: EndCause = "exited"
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    checkpoints: TenantTree | None = field(default=None, repr=False)


@dataclass
class Preparing:
    """An accepted assignment whose inputs are being fetched: it holds its GPUs and VRAM already, so
    that the commands handled meanwhile see them taken.

    Attributes:
        cmd / gpu_indices / vram_mb: as in :class:`Running`.
        cause: ``exited`` until the agent is told to drop it (then it never starts).
        fetch: the download task, cancelled when the assignment is dropped.
        task: the task that fetches, then starts it.
    """

    cmd: StartWork
    gpu_indices: list[int]
    vram_mb: int
    cause: EndCause = "exited"
    fetch: asyncio.Task[object] | None = field(default=None, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Assignments:
    """Assignments preparing or running here, by id, over the host's GPUs."""

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.by_id: dict[str, Running] = {}
        self.preparing: dict[str, Preparing] = {}

    def __len__(self) -> int:
        return len(self.by_id) + len(self.preparing)

    def __contains__(self, assignment_id: str) -> bool:
        return assignment_id in self.by_id or assignment_id in self.preparing

    def ids(self) -> list[str]:
        """Assignment ids, running ones oldest first, then those preparing."""
        return [*self.by_id, *self.preparing]

    def _all(self) -> list[Running | Preparing]:
        return [*self.by_id.values(), *self.preparing.values()]

    def free_gpus(self) -> list[int]:
        """Indices of GPUs no assignment holds."""
        held = {i for r in self._all() for i in r.gpu_indices}
        return [g.index for g in self.gpus if g.index not in held]

    def gpu_vram_mb(self) -> int:
        """VRAM of one GPU (the smallest, if they differ); 0 without GPUs."""
        return min((g.vram_total_mb for g in self.gpus), default=0)

    def vram_total_mb(self) -> int:
        """VRAM of every GPU together."""
        return sum(g.vram_total_mb for g in self.gpus)

    def vram_claimed_mb(self) -> int:
        """VRAM the assignments claim."""
        return sum(r.vram_mb for r in self._all())

    def model_of(self, indices: list[int]) -> str:
        """The model of the first of ``indices`` (empty for none)."""
        by_index = {g.index: g.model for g in self.gpus}
        return by_index.get(indices[0], "") if indices else ""

    def superseded_by(self, cmd: StartWork) -> list[Running | Preparing]:
        """Assignments of the same work (tenant, kind and id: two tenants may share a work id) and
        slot with an older epoch than ``cmd``."""
        work = (cmd.tenant, cmd.work_kind, cmd.work_id, cmd.slot)
        return [
            r
            for r in self._all()
            if (r.cmd.tenant, r.cmd.work_kind, r.cmd.work_id, r.cmd.slot) == work and r.cmd.epoch < cmd.epoch
        ]
