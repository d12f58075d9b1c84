"""What the agent remembers across restarts, in ``<state_dir>/commands.json``.

* handled command ids (the newest :data:`MAX_HANDLED`): a command is executed at most once, even
  when the work queue delivers it again (a restart before its ack, a retry after the server's
  duplicate window);
* the highest assignment epoch seen per work (the newest :data:`MAX_EPOCHS` works, each by its
  tenant, kind and id: :func:`agent.commands.work_key`): a command of an older epoch is stale and
  dropped;
* the assignments running now, so that after a crash the agent reports them failed (retryable): only
  what that report needs (:func:`recovery_record`), never a command's secrets. An entry goes the
  moment its assignment ends (or never starts).

The file is replaced atomically (write, fsync, rename) after every change, owner-readable only.

What it never holds: a ``StartWork``'s environment (a tenant's secrets), its presigned download,
resume and checkpoint URLs, its command or rendezvous. An agent that restarts runs none of its
interrupted assignments again: it reports them failed (retryable) and the kernel places them anew,
with fresh URLs in a fresh command, so nothing of a command is needed across a restart. A file an
older agent wrote with whole commands in it is cut down when read, and rewritten at the recovery.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import msgspec

from core.errors import ConfigError
from core.files import write_private
from schemas.commands import StartWork, WorkSpec

STATE_FILE = "commands.json"
MAX_HANDLED = 4096
MAX_EPOCHS = 4096


def recovery_record(cmd: StartWork) -> StartWork:
    """What the agent keeps of a running ``cmd`` across a crash: whose assignment it is (tenant,
    work, kind, assignment id, slot, epoch) and its runtime, which is all its end report needs
    (:func:`core.reports.ended`). The spec's environment, URLs, command and rendezvous are dropped:
    they are another tenant's secrets as far as any other workload on this host is concerned."""
    spec = WorkSpec(runtime=cmd.spec.runtime, gpus=cmd.spec.gpus, cpus=cmd.spec.cpus, shards=cmd.spec.shards)
    return msgspec.structs.replace(cmd, spec=spec)


class _Stored(msgspec.Struct, kw_only=True):
    handled: list[str] = []
    epochs: dict[str, int] = {}
    running: dict[str, StartWork] = {}


class CommandState:
    """Handled command ids, epochs per work id and running assignments, persisted."""

    def __init__(self, path: Path, max_handled: int = MAX_HANDLED, max_epochs: int = MAX_EPOCHS) -> None:
        self.path = path
        self.max_handled = max_handled
        self.max_epochs = max_epochs
        self._handled: OrderedDict[str, None] = OrderedDict()
        self._epochs: OrderedDict[str, int] = OrderedDict()
        self.running: dict[str, StartWork] = {}

    @classmethod
    def load(cls, state_dir: Path, **limits: int) -> CommandState:
        """Read ``<state_dir>/commands.json`` (an empty state if there is none).

        Raises:
            ConfigError: the file exists but cannot be read or decoded (the message names it).
        """
        state = cls(state_dir / STATE_FILE, **limits)
        if not state.path.exists():
            return state
        try:
            stored = msgspec.json.decode(state.path.read_bytes(), type=_Stored)
        except (OSError, msgspec.DecodeError) as exc:
            raise ConfigError(f"agent state file {state.path} is unreadable: {exc}") from None
        state._handled = OrderedDict.fromkeys(stored.handled[-state.max_handled :])
        state._epochs = OrderedDict(list(stored.epochs.items())[-state.max_epochs :])
        state.running = {k: recovery_record(cmd) for k, cmd in stored.running.items()}
        return state

    def save(self) -> None:
        """Write the state to disk, atomically (running assignments as :func:`recovery_record`)."""
        running = {k: recovery_record(cmd) for k, cmd in self.running.items()}
        stored = _Stored(handled=list(self._handled), epochs=dict(self._epochs), running=running)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_private(self.path, msgspec.json.encode(stored))

    def handled(self, command_id: str) -> bool:
        """Whether this command id was handled before."""
        return command_id in self._handled

    def mark_handled(self, command_id: str) -> None:
        """Remember a command id (the oldest are forgotten beyond the limit)."""
        self._handled[command_id] = None
        while len(self._handled) > self.max_handled:
            self._handled.popitem(last=False)

    def epoch(self, work_id: str) -> int:
        """The highest epoch seen for ``work_id`` (a work key, 0 if none)."""
        return self._epochs.get(work_id, 0)

    def observe(self, work_id: str, epoch: int) -> bool:
        """Record ``epoch`` for ``work_id``; ``False`` if it is older than one already seen (stale)."""
        if epoch < self._epochs.get(work_id, 0):
            return False
        self._epochs[work_id] = epoch
        self._epochs.move_to_end(work_id)
        while len(self._epochs) > self.max_epochs:
            self._epochs.popitem(last=False)
        return True
