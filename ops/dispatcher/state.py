"""What a dispatcher remembers across restarts, in its state dir.

* ``commands.json``: the command ids it handled and the highest epoch seen per work, exactly the
  agent's record (:class:`agent.state.CommandState`), so that a command is acted on at most once and a
  stale one is dropped, with the agent's rules (:func:`agent.commands.admit`);
* ``assignments.json``: every assignment it holds (:class:`Tracked`): the kernel's command, the node
  it runs on, whether its objects were applied, a replica's key, what was already reported about it
  and how far it was metered. A restarted dispatcher goes on from there: it reports nothing twice,
  meters no second twice, and deletes what the kernel no longer holds
  (:mod:`ops.dispatcher.reconcile`).

Both files are replaced atomically (write, fsync, rename) after every change, and readable by the
owner only (a replica's key is in the second).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from core.errors import ConfigError
from core.files import write_private
from ops.dispatcher.reporting import Reported
from schemas.commands import StartWork

ASSIGNMENTS_FILE = "assignments.json"
HISTORY_LINES = 64
"""Lines of a pod's log kept per assignment: where the next read picks up, and the log tail of a
failure."""


class Tracked(msgspec.Struct, kw_only=True):
    """One assignment the dispatcher holds.

    Attributes:
        cmd: the kernel's ``start_work``.
        worker_id / node: the node-worker it was placed on, and its node.
        applied: its objects were created in the cluster.
        api_key: a replica's key (in its Secret, and reported in ``replica_ready``).
        address: where a replica serves, once its Service has a node port.
        said: what was reported about it.
        history: the last :data:`HISTORY_LINES` lines read from its pod's log.
        metered_ms: the end of the last usage tick claimed (0: the pod never ran).
        ticks: how many ticks were claimed (their event ids count on).
    """

    cmd: StartWork
    worker_id: str
    node: str
    applied: bool = False
    api_key: str = ""
    address: str = ""
    said: Reported = msgspec.field(default_factory=Reported)
    history: list[str] = []
    metered_ms: int = 0
    ticks: int = 0


class _Stored(msgspec.Struct, kw_only=True):
    assignments: dict[str, Tracked] = {}


def load_assignments(state_dir: Path) -> dict[str, Tracked]:
    """The assignments kept in ``state_dir`` (none if it has no file yet).

    Raises:
        ConfigError: the file exists but cannot be read or decoded (the message names it).
    """
    path = state_dir / ASSIGNMENTS_FILE
    try:
        return dict(msgspec.json.decode(path.read_bytes(), type=_Stored).assignments)
    except FileNotFoundError:
        return {}
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"dispatcher state file {path} is unreadable: {exc}") from None


def save_assignments(state_dir: Path, assignments: dict[str, Tracked]) -> None:
    """Keep ``assignments`` in ``state_dir``, atomically, owner-readable only."""
    state_dir.mkdir(parents=True, exist_ok=True)
    write_private(state_dir / ASSIGNMENTS_FILE, msgspec.json.encode(_Stored(assignments=assignments)))


class HeldAssignments(dict[str, Tracked]):
    """The assignments a dispatcher holds, by assignment id, as read from ``state_dir`` at start;
    :meth:`save` keeps them there after every change (a dict, so that a round reads it as one)."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(load_assignments(state_dir))
        self.state_dir = state_dir

    def save(self) -> None:
        """Keep the held assignments in the state dir (:func:`save_assignments`)."""
        save_assignments(self.state_dir, dict(self))
