"""The projector service: keeps every projection live and snapshotted (``resontech projector``).

Services that need a projection fold it themselves (it is cheap and starts from the snapshot this
service keeps fresh); this process makes sure a recent, verified snapshot of each one exists, which
is what ``resontech replay`` audits against.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from core.log import EventLog
from core.settings import Settings
from ops.process import service_connection
from projections import ALL
from projections.base import Projection
from projections.runner import ProjectionRunner

log = logging.getLogger("resontech.projector")


async def run(settings: Settings, projections: Sequence[Projection[Any]] = ALL) -> None:
    """Run one :class:`ProjectionRunner` per projection until SIGINT/SIGTERM; snapshot on the way out."""
    async with service_connection(settings, "projector") as (event_log, stop):
        await _project(event_log, stop, settings, projections)


async def _project(
    event_log: EventLog, stop: asyncio.Event, settings: Settings, projections: Sequence[Projection[Any]]
) -> None:
    runners = [
        ProjectionRunner(
            event_log,
            projection,
            snapshot_every=settings.snapshot_every,
            snapshot_interval_s=settings.snapshot_interval_s,
        )
        for projection in projections
    ]
    tasks = [asyncio.create_task(runner.run(stop), name=runner.projection.name) for runner in runners]
    log.info("projector running: %s", ", ".join(p.name for p in projections))
    try:
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        log.info("projector stopped at %s", {r.projection.name: r.seq for r in runners})
