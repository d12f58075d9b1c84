"""The agent's identity (:mod:`agent.identity`): a worker id made once and kept, one agent per state dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.identity import StateDirLock, worker_id
from core.errors import ConfigError


def test_worker_id_is_created_once_and_kept(tmp_path: Path) -> None:
    first = worker_id(tmp_path / "state")
    assert first.startswith("w-") and len(first) == 14 and first[2:].isalnum()
    assert worker_id(tmp_path / "state") == first
    assert worker_id(tmp_path / "other") != first
    (tmp_path / "state" / "worker_id").write_text("not a.token\n")
    with pytest.raises(ConfigError, match="is not a valid worker id"):
        worker_id(tmp_path / "state")


def test_state_dir_lock_refuses_a_second_agent(tmp_path: Path) -> None:
    lock = StateDirLock(tmp_path)
    lock.acquire()
    # flock locks belong to open files, so a second open file in this process conflicts too
    with pytest.raises(ConfigError, match=f"in use by pid {os.getpid()}"):
        StateDirLock(tmp_path).acquire()
    lock.release()
    StateDirLock(tmp_path).acquire()
