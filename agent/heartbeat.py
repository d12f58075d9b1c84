"""Heartbeats, and appends that must not stop the agent when the server is slow or away.

Each beat is sent without waiting for the previous one's acknowledgement (at most
:data:`MAX_BEATS_IN_FLIGHT` outstanding; beyond that a beat is skipped), so a slow server never
slows the cadence, and a failed beat is logged once per outage, never fatal. GPU telemetry is read in
a thread with a deadline: NVML can hang on a sick GPU, and the beat goes out without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from agent import host
from agent.devices import DeviceSource
from core.errors import AppendRejected, InvalidInput, NoResponders, ResontechError
from core.log import EventLog
from core.streams import heartbeat_subject
from schemas._base import Event
from schemas.values import GpuTelemetry
from schemas.workers import Heartbeat

logger = logging.getLogger("resontech.agent")
MAX_BEATS_IN_FLIGHT = 4
REPORT_PATIENCE_S = 30.0
"""How long an agent keeps trying to store a report (started, progress, ended, usage): longer than a
stream's leader election (4-9 s) or a node's restart, after which its clients reconnect elsewhere."""
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 4.0


class Heartbeats:
    """The heartbeat loop of one worker.

    Args:
        log: the event log.
        worker_id: the worker.
        interval_s: seconds between beats.
        devices: GPU telemetry; ``has_gpus`` false skips it.
        running: returns the ids of the assignments running now.
    """

    def __init__(
        self,
        log: EventLog,
        worker_id: str,
        interval_s: float,
        devices: DeviceSource,
        *,
        has_gpus: bool,
        running: Callable[[], list[str]],
    ) -> None:
        self.log = log
        self.subject = heartbeat_subject(worker_id)
        self.interval_s = interval_s
        self.devices = devices
        self.has_gpus = has_gpus
        self.running = running
        self._cpu = host.CpuLoad()
        self._failing = False

    async def run(self) -> None:
        """Beat every ``interval_s`` seconds, forever (cancel to stop)."""
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Task[None]] = set()
        next_at = loop.time()
        while True:
            beat = Heartbeat(
                interval_s=self.interval_s,
                gpus=await self._telemetry(),
                cpu_pct=self._cpu.percent(),
                memory_used_mb=host.memory_used_mb(),
                running=self.running(),
            )
            if len(in_flight) < MAX_BEATS_IN_FLIGHT:
                task = asyncio.create_task(self._send(beat))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            elif not self._failing:
                logger.warning("heartbeats skipped while %d wait for the server", len(in_flight))
                self._failing = True
            next_at = max(next_at + self.interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _telemetry(self) -> list[GpuTelemetry]:
        if not self.has_gpus:
            return []
        timeout = max(self.interval_s, 0.5)
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.devices.telemetry), timeout)
        except TimeoutError:
            logger.warning("GPU telemetry took longer than %.1fs; heartbeat sent without it", timeout)
            return []

    async def _send(self, beat: Heartbeat) -> None:
        try:
            await self.log.append(self.subject, beat)
        except ResontechError as exc:
            if not self._failing:
                logger.warning("heartbeat not stored: %s (will keep trying)", exc.message)
            self._failing = True
            return
        if self._failing:
            logger.info("heartbeats stored again")
            self._failing = False


async def append_reliably(
    log: EventLog, items: Sequence[tuple[str, Event, str]], patience_s: float = REPORT_PATIENCE_S
) -> bool:
    """Append events in order, retrying failures with the same event ids (stored once however often
    retried) and pauses that grow from :data:`RETRY_FIRST_S` to :data:`RETRY_MAX_S`, for up to
    ``patience_s``; give up at once when the server refuses them. Nothing answering (a stream
    electing its leader) and no acknowledgement (a connection moving to another node) are waited out.

    Returns:
        Whether every event was stored.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    delay, attempt = RETRY_FIRST_S, 0
    while True:
        attempt += 1
        try:
            await log.append_many(items)
        except ResontechError as exc:
            refused = isinstance(exc, AppendRejected | InvalidInput) and not isinstance(exc, NoResponders)
            if refused or loop.time() + delay > deadline:
                text = "append of %d event(s) failed after %d attempt(s), given up: %s"
                logger.error(text, len(items), attempt, exc.message)
                return False
            if attempt == 1:
                text = "append of %d event(s) failed, retrying for up to %.0fs: %s"
                logger.warning(text, len(items), patience_s, exc.message)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        if attempt > 1:
            logger.info("append of %d event(s) stored after %d attempts", len(items), attempt)
        return True
