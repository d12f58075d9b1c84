"""The process runtime (:mod:`agent.runtimes.process`) with real child processes and no server: output and
exit status, cancel, the workload's group, start failures, orphans, a clean environment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.runtimes import RUNTIMES, StartFailed, workload_env
from agent.runtimes.process import ProcessRuntime, reap_orphans
from core.cgroups import detect
from core.sandbox import Sandbox
from schemas.commands import WorkSpec
from tests.support.agent_commands import cmd


def test_workload_env_is_clean_and_never_holds_credentials(tmp_path: Path) -> None:
    host_env = {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "en_GB.UTF-8",
        "HOME": "/root",
        "RESONTECH_NATS_URL": "nats://secret:4222",
        "RESONTECH_NATS_PASSWORD": "hunter2",
        "RESONTECH_NATS_CREDS": "/etc/agent.creds",
        "RESONTECH_S3_SECRET_KEY": "s3cret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "SSH_AUTH_SOCK": "/tmp/ssh",
    }
    command = cmd(
        env={"BATCH": "32", "RESONTECH_NATS_URL": "nats://evil", "resontech_epoch": "99"},
        assignment_id="a7",
        epoch=3,
        slot=1,
    )
    env = workload_env(command, tmp_path / "a7", gpu_indices=[], host_env=host_env)
    assert env == {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "en_GB.UTF-8",
        "HOME": str(tmp_path / "a7"),
        "TMPDIR": str(tmp_path / "a7" / "tmp"),
        "PYTHONUNBUFFERED": "1",
        "BATCH": "32",
        "RESONTECH_ASSIGNMENT_ID": "a7",
        "RESONTECH_WORK_ID": "j1",
        "RESONTECH_WORK_KIND": "job",
        "RESONTECH_TENANT": "acme",
        "RESONTECH_SLOT": "1",
        "RESONTECH_EPOCH": "3",
        "RESONTECH_DATA_ROOT": str(tmp_path / "a7" / "data"),
        "RESONTECH_CHECKPOINT_DIR": str(tmp_path / "a7" / "checkpoints"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    gpu_env = workload_env(cmd(gpus=2, resume_from="ckpt/r3.pt"), tmp_path, gpu_indices=[1, 3], host_env={})
    assert gpu_env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert gpu_env["RESONTECH_RESUME_FROM"] == "ckpt/r3.pt"
    assert gpu_env["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _pids_running(argv: list[str]) -> list[int]:
    """The host's processes whose command line is ``argv``."""
    found = []
    for pid in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if pid.isdigit() and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] == [
                a.encode() for a in argv
            ]:
                found.append(int(pid))
    return found


async def _run(code: str, workdir: Path, env: dict[str, str] | None = None) -> Any:
    spec = WorkSpec(runtime="process", command=[sys.executable, "-c", code])
    return await ProcessRuntime(Sandbox.for_host(cgroups=detect())).start(
        spec, workdir, env or {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"}
    )


async def test_process_runtime_captures_output_and_exit_status(tmp_path: Path) -> None:
    workload = await _run(
        "import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)", tmp_path / "a"
    )
    lines = [line async for line in workload.lines()]
    assert sorted(lines) == ["err", "out"]
    assert await workload.wait() == 7
    assert set(workload.log_tail(40).splitlines()) == {"out", "err"}
    assert (tmp_path / "a" / "data").is_dir() and not (tmp_path / "a" / "pid").exists()


async def test_process_runtime_cancel_escalates_to_sigkill(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up'); time.sleep(60)"
    workload = await _run(code, tmp_path / "a")
    lines = workload.lines()
    assert await anext(lines) == "up"
    started = time.monotonic()
    assert await workload.cancel(0.3) == -signal.SIGKILL
    assert 0.25 <= time.monotonic() - started < 3


async def test_process_runtime_kills_what_the_workload_left_in_its_group(tmp_path: Path) -> None:
    marker = f"{secrets.randbelow(10**6) + 10**6}"  # the child's pid inside the sandbox means nothing here
    code = f"import subprocess; p = subprocess.Popen(['sleep', '{marker}']); print('left it')"
    workload = await _run(code, tmp_path / "a")
    assert [line async for line in workload.lines()] == ["left it"]
    assert await workload.wait() == 0
    await asyncio.sleep(0.1)
    assert not [pid for pid in _pids_running(["sleep", marker]) if _running(pid)]


async def test_process_runtime_start_failures(tmp_path: Path) -> None:
    runtime = RUNTIMES["process"](Sandbox.for_host())
    with pytest.raises(StartFailed, match="empty command"):
        await runtime.start(WorkSpec(runtime="process"), tmp_path, {})
    with pytest.raises(StartFailed, match="cannot start 'no-such-binary-xyz'"):
        await runtime.start(
            WorkSpec(runtime="process", command=["no-such-binary-xyz"]), tmp_path, {"PATH": "/bin"}
        )


async def test_reap_orphans_kills_only_processes_that_carry_their_assignment(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "RESONTECH_ASSIGNMENT_ID": "a1"}
    ours = await _run("import time; time.sleep(60)", tmp_path / "a1", env)
    stranger = await _run("import time; time.sleep(60)", tmp_path / "a2", {"PATH": os.environ["PATH"]})
    try:
        assert reap_orphans(tmp_path) == ["a1"]
        assert await asyncio.wait_for(ours.wait(), 5) == -signal.SIGKILL
        assert stranger.returncode is None
    finally:
        await stranger.cancel(0.1)
