"""From a workload's output lines to the agent's reports: progress, checkpoints, readiness.

Each line of the protocol (:mod:`agent.protocol`) becomes a claim (:func:`agent.reports.reported`).
Progress goes out at most once a second per assignment (:class:`agent.reports.ProgressCoalescer`): a
workload printing a line per step would otherwise append an event per step; what is pending goes
out when the second has passed even if no line comes, before any other report of the assignment (so
order is kept), and at the end. A checkpoint file is uploaded to the assignment's presigned URLs
first (:class:`agent.checkpoints.CheckpointUploads`). A malformed line is logged and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec

from agent import reports
from agent.checkpoints import CheckpointUploads
from agent.protocol import CheckpointLine, ProgressLine, ProtocolError, ReadyLine, parse_line
from agent.reports import Append
from core.files import TenantTree
from schemas.commands import StartWork

log = logging.getLogger("resontech.agent")
Report = ProgressLine | CheckpointLine | ReadyLine


async def forward_reports(
    cmd: StartWork,
    lines: AsyncIterator[str],
    checkpoint_folder: TenantTree | None,
    emit: Callable[[list[Append]], Awaitable[bool]],
    gpu_util: Callable[[], float | None],
) -> None:
    """Turn the workload's ``lines`` into reports for ``cmd`` and ``emit`` them, until the lines end.

    Args:
        checkpoint_folder: the workload's ``$RESONTECH_CHECKPOINT_DIR``, held by an fd taken before
            the workload started (``None``: file checkpoints are refused).
        gpu_util: the assignment's GPU utilisation now, for progress that does not say it.
    """
    uploads = CheckpointUploads.of(cmd, checkpoint_folder)
    progress = reports.ProgressCoalescer()
    sent = 0

    async def send(report: Report | None) -> None:
        nonlocal sent
        if report is not None:
            sent += 1
            item = reports.reported(cmd, report, sent)
            if item is not None:
                await emit([item])

    following: asyncio.Future[str] | None = None
    try:
        while True:
            following = following or asyncio.ensure_future(anext(lines))
            due = progress.due_in(time.monotonic()) if progress.pending else None
            await asyncio.wait({following}, timeout=due)
            if not following.done():  # a coalesced progress report is due
                await send(progress.take(time.monotonic()))
                continue
            try:
                line = following.result()
            except StopAsyncIteration:
                break
            following = None
            try:
                report = parse_line(line)
            except ProtocolError as exc:
                log.warning("%s: ignored a malformed line: %s", cmd.assignment_id, exc)
                continue
            if isinstance(report, ProgressLine):
                if report.gpu_util_pct is None:
                    report = msgspec.structs.replace(report, gpu_util_pct=gpu_util())
                await send(progress.offer(report, time.monotonic()))
                continue
            await send(progress.take(time.monotonic()))  # what came before goes first
            if isinstance(report, CheckpointLine):
                report = await uploads.resolve(report)
            await send(report)
    finally:
        if following is not None and not following.done():
            following.cancel()
        await send(progress.take(time.monotonic()))
