"""The agent's commands: taken from its work queue one at a time, and executed at most once each.

The queue (the worker's durable consumer on COMMANDS, :meth:`core.log.EventLog.commands`) delivers
at least once: a command not acknowledged in time, or delivered just before a restart, comes again.
:func:`take_commands` hands each delivery to the agent's handler while holding the agent's busy
lock (so a stopping agent never cancels a command half-handled) and acknowledges it after; a
failure of the queue itself (the server went away mid-subscribe) is logged and retried, never fatal.

:func:`admit` turns at-least-once into at-most-once, with what the state dir remembers
(:mod:`agent.state`): a command id is recorded as handled before the command is acted on, and one
handled before is skipped; a command whose epoch is lower than the highest seen for its work is
stale and dropped, unless it stops an assignment running here at that very epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from agent.state import CommandState
from core.log import EventLog
from schemas.commands import StartWork, StopWork
from schemas.envelope import Recorded

log = logging.getLogger("resontech.agent")
RETRY_S = 1.0
"""How long the agent waits before subscribing again after its command queue failed."""

Admission = Literal["run", "duplicate", "stale"]


async def take_commands(
    event_log: EventLog,
    worker_id: str,
    busy: asyncio.Lock,
    handle: Callable[[Recorded[Any]], Awaitable[None]],
) -> None:
    """Hand ``worker_id``'s commands to ``handle``, oldest first, one at a time under ``busy``, and
    acknowledge each once handled; forever (until cancelled)."""
    while True:
        try:
            async with contextlib.aclosing(event_log.commands(worker_id)) as commands:
                async for record, ack in commands:
                    async with busy:
                        await handle(record)
                        with contextlib.suppress(Exception):  # unacked: redelivered, then skipped
                            await ack()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the server went away mid-subscribe, or a bug: keep serving
            log.warning("command intake failed, retrying in 1s: %s: %s", type(exc).__name__, exc)
            log.debug("command intake failure", exc_info=True)
            await asyncio.sleep(RETRY_S)


def command_id(record: Recorded[Any]) -> str:
    """The id a command is executed at most once by: its event id (its sequence if it has none)."""
    return record.msg_id or f"seq-{record.seq}"


def admit(
    state: CommandState, command_id: str, cmd: StartWork | StopWork, *, running_epoch: int | None
) -> Admission:
    """Whether to act on a start or stop command: ``run``, ``duplicate`` (its id was handled before)
    or ``stale`` (an older epoch than one seen for its work). Records it as handled (and its epoch)
    in ``state``, saved, before returning ``run`` or ``stale``.

    A stop of an assignment running here at that very epoch (``running_epoch``: the epoch of the
    assignment it names, ``None`` when not here) is never stale: one slot of a job may be re-placed
    at a newer epoch while another keeps its older one (both on this agent), and stopping the older
    one must still work.
    """
    if state.handled(command_id):
        return "duplicate"
    fresh = state.observe(cmd.work_id, cmd.epoch) or (
        isinstance(cmd, StopWork) and running_epoch == cmd.epoch
    )
    state.mark_handled(command_id)
    state.save()
    return "run" if fresh else "stale"


def admit_once(state: CommandState, command_id: str) -> bool:
    """Record a command without an epoch (a verification) as handled, saved; ``False`` if it was
    handled before."""
    if state.handled(command_id):
        return False
    state.mark_handled(command_id)
    state.save()
    return True
