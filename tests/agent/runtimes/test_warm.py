"""Warm engines, without vLLM: the command an engine takes, how a replica adopts an engine's folder,
and what a crashed agent's successor finds (the engine itself runs in
tests/e2e/inference/test_inference.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agent.engines.warm import MAX_COMMAND_BYTES, BadCommand, parse_command
from agent.runtimes.process import MARKER, reap_orphans, started_dirs
from agent.runtimes.warm import WarmEngine, WarmEngines, adopt, remove_leftovers, seen_from, start_env
from core.sandbox import Sandbox


def test_a_command_is_a_list_of_arguments_and_a_map_of_strings() -> None:
    argv, env = parse_command(json.dumps({"argv": ["--model", "m"], "env": {"HOME": "/w"}}).encode())
    assert argv == ["--model", "m"] and env == {"HOME": "/w"}
    for bad in (
        b"not json",
        b"[]",
        json.dumps({"argv": "--model m", "env": {}}).encode(),
        json.dumps({"argv": ["--port", 1], "env": {}}).encode(),
        json.dumps({"argv": [], "env": {"A": 1}}).encode(),
        json.dumps({"argv": []}).encode(),
        json.dumps({"argv": ["x" * MAX_COMMAND_BYTES], "env": {}}).encode(),
    ):
        with pytest.raises(BadCommand):
            parse_command(bad)


def test_a_replica_adopts_the_engines_folder_with_its_inputs(tmp_path: Path) -> None:
    engine = tmp_path / "warm-abc"
    (engine / "tmp").mkdir(parents=True)
    (engine / "data").mkdir()
    (engine / "log.txt").write_text("warm engine: imported in 8.00s\n")
    workdir = tmp_path / "asg-1"
    (workdir / "model").mkdir(parents=True)
    (workdir / "model" / "config.json").write_text("{}")
    (workdir / "data" / "shard").mkdir(parents=True)
    (workdir / "tmp").mkdir()
    adopt(engine, workdir)
    assert not engine.exists()
    assert (workdir / "model" / "config.json").read_text() == "{}"
    assert (workdir / "data" / "shard").is_dir() and (workdir / "log.txt").read_text().startswith("warm")
    # a replica with nothing fetched simply takes the folder
    other = tmp_path / "warm-def"
    other.mkdir()
    adopt(other, tmp_path / "asg-2")
    assert (tmp_path / "asg-2").is_dir() and not other.exists()


def test_paths_are_given_as_the_engines_sandbox_sees_them(tmp_path: Path) -> None:
    workdir, engine = tmp_path / "asg-1", tmp_path / "warm-abc"
    assert seen_from(str(workdir / "model"), workdir, engine) == str(engine / "model")
    assert seen_from(str(workdir), workdir, engine) == str(engine)
    assert seen_from(f"{workdir}-other/x", workdir, engine) == f"{workdir}-other/x"  # a prefix, not a path
    assert seen_from("smollm2", workdir, engine) == "smollm2"


def test_an_engines_own_environment_is_clean_and_marked(tmp_path: Path) -> None:
    engine = tmp_path / "warm-abc"
    env = start_env(
        engine,
        {"OMP_WAIT_POLICY": "PASSIVE", "RESONTECH_NATS_CREDS": "/secret"},
        {"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "x"},
    )
    assert env["HOME"] == str(engine) and env[MARKER] == "warm-abc" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "RESONTECH_NATS_CREDS" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_an_adopted_engine_left_running_by_a_crashed_agent_is_killed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    engine = work / "warm-abc"
    engine.mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(engine), MARKER: engine.name}
    proc = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        workdir = work / "asg-1"
        adopt(engine, workdir)
        (workdir / "pid").write_text(f"{proc.pid} {engine.name}")  # as ProcessWorkload.moved_to writes it
        leftover = work / "warm-def"
        leftover.mkdir()
        # its cgroup is named after the folder it started in, which the agent releases too
        assert set(started_dirs(work)) == {workdir, leftover, engine}
        assert reap_orphans(work) == ["asg-1"]
        remove_leftovers(work)
        deadline = time.monotonic() + 5
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.returncode is not None and not leftover.exists() and workdir.exists()
    finally:
        proc.kill()
        proc.wait()


class _Exited:
    """A workload that has exited (for the pool's bookkeeping only)."""

    returncode = -9

    def log_tail(self, n: int = 40) -> str:
        return "Killed"


def test_no_engine_waiting_starts_none_beside_a_cold_start_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    pool = WarmEngines(Sandbox(bwrap=None), tmp_path, 1, {})
    started: list[str] = []

    def record(work: Any) -> None:
        started.append(work.__qualname__)
        work.close()

    pool._spawn = record  # type: ignore[method-assign]
    assert pool.take() is None and started == []  # the replacement waits for the taken one's replica
    pool.ready.append(WarmEngine(tmp_path / "warm-dead", _Exited()))  # type: ignore[arg-type]
    assert pool.take() is None and pool.ready == []
    assert started == ["WarmEngines._cleanup", "WarmEngines._start_one"]
