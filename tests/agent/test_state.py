"""The agent's command state (:mod:`agent.state`): bounded and persisted."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.state import CommandState, recovery_record
from core.errors import ConfigError
from tests.support.agent_commands import cmd


def test_command_state_is_bounded_and_persisted(tmp_path: Path) -> None:
    state = CommandState.load(tmp_path, max_handled=3, max_epochs=2)
    for i in range(5):
        state.mark_handled(f"c{i}")
    assert [state.handled(f"c{i}") for i in range(5)] == [False, False, True, True, True]
    assert state.observe("j1", 2) and not state.observe("j1", 1) and state.observe("j1", 2)
    assert state.observe("j2", 1) and state.observe("j3", 1)  # j1 is forgotten beyond two work ids
    state.running["a1"] = cmd()
    state.save()
    again = CommandState.load(tmp_path, max_handled=3, max_epochs=2)
    assert again.handled("c4") and not again.handled("c1")
    assert (again.epoch("j1"), again.epoch("j3")) == (0, 1)
    assert again.running == {"a1": recovery_record(cmd())}  # what its end report needs, no command
    (tmp_path / "commands.json").write_text("{broken")
    with pytest.raises(ConfigError, match=r"commands\.json is unreadable"):
        CommandState.load(tmp_path)
