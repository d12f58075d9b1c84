"""The agent's settings (:mod:`agent.settings`): environment, flags, defaults, and a bad one named."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.settings import load_agent_settings, topology_of
from core.errors import ConfigError


def test_agent_settings_env_flags_and_defaults(tmp_path: Path) -> None:
    env = {"RESONTECH_AGENT_NAME": "gpu-1", "RESONTECH_AGENT_HEARTBEAT_INTERVAL_S": "0.5"}
    s = load_agent_settings(tmp_path, {"region": "eu-west", "heartbeat_interval_s": 2.0, "pool": None}, env)
    assert (s.name, s.region, s.heartbeat_interval_s, s.metering_interval_s) == (
        "gpu-1",
        "eu-west",
        2.0,
        10.0,
    )
    assert s.state_dir == str(tmp_path / "agents" / "gpu-1")
    assert s.work_dir == str(tmp_path / "agents" / "gpu-1.work")  # beside the state dir, not in it
    assert (s.pool, s.device_source, s.policy_file) == ("shared", "nvml", None)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RESONTECH_AGENT_HEARTBEAT_INTERVAL_S": "fast"}, "RESONTECH_AGENT_HEARTBEAT_INTERVAL_S='fast'"),
        ({"RESONTECH_AGENT_POOL": "cheap"}, "RESONTECH_AGENT_POOL='cheap' is not a valid choice"),
        ({"RESONTECH_AGENT_DEVICE_SOURCE": "cuda"}, "RESONTECH_AGENT_DEVICE_SOURCE"),
        ({"RESONTECH_AGENT_NAME": "a.b"}, "RESONTECH_AGENT_NAME 'a.b' must be"),
        ({"RESONTECH_AGENT_POOL": "private"}, "OWNER_TENANT is required for a private pool"),
        ({"RESONTECH_AGENT_METERING_INTERVAL_S": "0"}, "METERING_INTERVAL_S must be between"),
        ({"RESONTECH_AGENT_TOPOLOGY": "rack=r1,galaxy=g1"}, "TOPOLOGY 'galaxy=g1': give level=name"),
        ({"RESONTECH_AGENT_TOPOLOGY": "rack=r1,rack=r2"}, "TOPOLOGY 'rack=r2'"),
        ({"RESONTECH_AGENT_TOPOLOGY": "rack"}, "TOPOLOGY 'rack'"),
        ({"RESONTECH_AGENT_TOPOLOGY": "rack=a b"}, "TOPOLOGY 'rack=a b'"),
    ],
)
def test_bad_agent_settings_name_the_setting(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_agent_settings(tmp_path, {}, {"RESONTECH_AGENT_NAME": "a", **env})
    assert message in caught.value.message and "\n" not in caught.value.message


def test_a_hosts_topology_labels_read_by_level() -> None:
    assert topology_of("") == {}
    assert topology_of("rack=r12, block=b3,") == {"rack": "r12", "block": "b3"}
