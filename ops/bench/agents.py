"""Real agents as a benchmark's child processes, and how a benchmark starts and stops a child.

Used by the schedule benchmark's failure detection (:mod:`ops.bench.failover`) and by the training
benchmark (:mod:`ops.bench.training`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent.runtimes.process import reap_orphans
from agent.settings import default_work_dir
from core.settings import Settings
from ops.bench.common import process_peak_rss_mb
from ops.enrollment import enroll_state_dir

REPO = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without its ``RESONTECH_`` settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env.update(extra)
    return env


def stop_child(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def until(predicate: Any, what: str, timeout: float = 30.0, step_s: float = 0.02) -> Any:
    """Poll ``predicate()`` every ``step_s`` (20 ms) until it is truthy, and return its value;
    TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(step_s)
    raise TimeoutError(f"timed out waiting until {what}")


class Agent:
    """One real ``python -m ops.cli agent`` child process (1 s heartbeats) with its state dir."""

    def __init__(self, name: str, root: Path, url: str) -> None:
        self.name = name
        self.root = root
        self.state_dir = root / name
        self.env = child_env(RESONTECH_NATS_URL=url, RESONTECH_DATA_DIR=str(root))
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss_mb = 0.0

    def start(self) -> Agent:
        """Enroll it (as the operator: it runs with the kernel's credentials), then start it."""
        enroll_state_dir(Settings(nats_url=self.env["RESONTECH_NATS_URL"]), self.state_dir)
        argv = [sys.executable, "-m", "ops.cli", "agent", "--name", self.name]
        argv += ["--state-dir", str(self.state_dir), "--stop-grace", "2"]
        with (self.root / f"{self.name}.log").open("ab") as err:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=err, stderr=err)
        return self

    @property
    def work_dir(self) -> Path:
        """Its workloads' working directories (beside its state dir)."""
        return default_work_dir(self.state_dir)

    async def worker_id(self) -> str:
        path = self.state_dir / "worker_id"
        await until(path.exists, f"{self.name} wrote its worker id")
        return path.read_text().strip()

    def note_rss(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.peak_rss_mb = max(self.peak_rss_mb, process_peak_rss_mb(self.proc.pid))

    def kill(self) -> None:
        assert self.proc is not None
        self.note_rss()
        self.proc.kill()
        self.proc.wait()
        reap_orphans(self.work_dir)  # its workload outlived it: kill it

    def stop(self) -> None:
        self.note_rss()
        if self.proc is not None:
            stop_child(self.proc)
        reap_orphans(self.work_dir)
