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

A work is its tenant, kind and id together (:func:`work_key`): tenants choose their job and
endpoint ids, so two tenants' jobs (or a job and an endpoint) may share one, and neither's epochs
may make the other's commands stale. A stop acts on a workload only when it names that workload's
assignment, epoch, tenant, kind and work id (:func:`stops`).
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


def work_key(tenant: str, kind: str, work_id: str) -> str:
    """The key of one work's epochs: ``<tenant>/<kind>/<work_id>`` (tenants and kinds hold no ``/``,
    so no two works share a key)."""
    return f"{tenant}/{kind}/{work_id}"


def work_of(cmd: StartWork | StopWork, here: StartWork | None) -> str:
    """The :func:`work_key` of ``cmd``'s work. A stop sent before stops named their tenant takes
    it from ``here`` (the start of the assignment it names, running here), else it has none."""
    if isinstance(cmd, StartWork) or cmd.tenant:
        return work_key(cmd.tenant, cmd.work_kind, cmd.work_id)
    if here is not None and here.work_id == cmd.work_id:
        return work_key(here.tenant, here.work_kind, here.work_id)
    return work_key("", "", cmd.work_id)


def stops(cmd: StopWork, start: StartWork) -> bool:
    """Whether the stop ``cmd`` is about the workload ``start`` runs: the same assignment and epoch,
    and the same tenant, kind and work id where the stop names them (every stop the kernel sends
    does; only one sent before stops named them does not)."""
    if (cmd.assignment_id, cmd.epoch, cmd.work_id) != (start.assignment_id, start.epoch, start.work_id):
        return False
    return not cmd.tenant or (cmd.tenant, cmd.work_kind) == (start.tenant, start.work_kind)


def admit(
    state: CommandState, command_id: str, cmd: StartWork | StopWork, *, here: StartWork | None
) -> Admission:
    """Whether to act on a start or stop command: ``run``, ``duplicate`` (its id was handled before)
    or ``stale`` (an older epoch than one seen for its work, :func:`work_of`). Records it as handled
    (and its epoch) in ``state``, saved, before returning ``run`` or ``stale``.

    A stop of an assignment running here at that very epoch (``here``: the start of the assignment
    it names, ``None`` when not here) is never stale: one slot of a job may be re-placed at a newer
    epoch while another keeps its older one (both on this agent), and stopping the older one must
    still work.
    """
    if state.handled(command_id):
        return "duplicate"
    fresh = state.observe(work_of(cmd, here), cmd.epoch) or (
        isinstance(cmd, StopWork) and here is not None and stops(cmd, here)
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
