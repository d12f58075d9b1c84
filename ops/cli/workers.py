"""Operator actions on workers: ``resontech cordon`` / ``uncordon`` (the enrollment of a kernel-run
agent is :mod:`ops.enrollment`)."""

from __future__ import annotations

import getpass

from core.errors import NotFound
from core.log import EventLog
from core.settings import Settings
from core.streams import token, worker_subject
from schemas.workers import WorkerCordoned, WorkerUncordoned


async def cordon(settings: Settings, worker_id: str, reason: str, *, uncordon: bool = False) -> str:
    """Cordon (or uncordon) a registered worker; returns a one-line confirmation."""
    token(worker_id, "worker id")
    by = f"operator:{getpass.getuser()}"
    async with await EventLog.connect(settings, name="cordon") as event_log:
        if await event_log.last_seq("WORKERS", f"worker.{worker_id}.registered") == 0:
            raise NotFound(f"no registered worker {worker_id}")
        event = WorkerUncordoned(by=by) if uncordon else WorkerCordoned(reason=reason, by=by)
        await event_log.append(worker_subject(worker_id, event), event)
    return f"{worker_id} {'uncordoned' if uncordon else 'cordoned'}"
