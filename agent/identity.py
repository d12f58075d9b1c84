"""The agent's identity: a worker id created once and kept in the state dir, and a lock on that dir.

The worker id is ``w-<12 hex>``: a safe NATS subject token, unique across hosts, and stable across
restarts, so a restarted agent re-registers as the same worker and finds its durable command
consumer (``agent-<worker_id>``) with every command queued while it was away.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
from pathlib import Path
from typing import IO

from core.errors import ConfigError
from core.files import write_private

WORKER_ID_FILE = "worker_id"
LOCK_FILE = "agent.lock"
_WORKER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def new_worker_id() -> str:
    """A fresh worker id, ``w-`` and 12 hex digits."""
    return f"w-{secrets.token_hex(6)}"


def worker_id(state_dir: Path) -> str:
    """The worker id kept in ``state_dir/worker_id``, created there on first use.

    Raises:
        ConfigError: the state dir is not writable, or the file holds something that is not a
            safe id (the message names the file).
    """
    path = state_dir / WORKER_ID_FILE
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        if path.exists():
            value = path.read_text().strip()
            if not _WORKER_ID.match(value):
                raise ConfigError(f"{path}: {value[:40]!r} is not a valid worker id")
            return value
        value = new_worker_id()
        write_private(path, value + "\n")
        return value
    except OSError as exc:
        raise ConfigError(f"agent state dir {state_dir}: {exc.strerror or exc}") from None


def owner_only(state_dir: Path, work_dir: Path) -> None:
    """Make the agent's state dir and work dir, and every file directly in the state dir, the
    owner's alone (0700 / 0600), including those an older agent left readable to all. Workloads never
    see either (they run in the sandbox of their own assignment's directory); this keeps out the
    host's other users.

    Raises:
        ConfigError: they cannot be made or changed.
    """
    try:
        for d in (state_dir, work_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            d.chmod(0o700)
        for path in state_dir.iterdir():
            if path.is_file() and not path.is_symlink():
                path.chmod(0o600)
    except OSError as exc:
        raise ConfigError(f"agent state dir {state_dir}: {exc.strerror or exc}") from None


class StateDirLock:
    """An exclusive lock on the state dir for the agent's lifetime (two agents, one id: refused).

    Raises:
        ConfigError: another live process holds the lock (the message names its pid).
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`ConfigError`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise ConfigError(f"agent state dir {self.path.parent} is in use by pid {holder}") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f

    def release(self) -> None:
        """Release the lock (the file stays; it holds no meaning once unlocked)."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
