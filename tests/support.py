"""Helpers for tests that run real agent processes (the ``agents`` fixture is in conftest)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.runtimes.process import reap_orphans
from core.log import EventLog
from ops.coordinator import Coordinator, running
from schemas.envelope import Recorded

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 20.0


class AgentProcess:
    """One ``python -m ops.cli agent`` child process with its own state dir."""

    def __init__(self, name: str, root: Path, nats_url: str, *extra: str) -> None:
        self.name = name
        self.state_dir = root / name
        self.stderr_path = root / f"{name}.stderr"
        self.extra = list(extra)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        self.env.update(
            RESONTECH_NATS_URL=nats_url,
            RESONTECH_DATA_DIR=str(root),
            RESONTECH_AGENT_METERING_INTERVAL_S="0.5",
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "ops.cli", "agent", "--name", self.name, "--state-dir", str(self.state_dir),
            "--heartbeat", "0.2", "--stop-grace", "2", *self.extra,
        ]  # fmt: skip

    def start(self) -> AgentProcess:
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(self.argv(), cwd=REPO, env=self.env, stdout=err, stderr=err)
        return self

    async def worker_id(self) -> str:
        path = self.state_dir / "worker_id"
        await until(path.exists, "the agent wrote its worker id")
        return path.read_text().strip()

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        reap_orphans(self.state_dir / "work")


async def until(predicate: Callable[[], Any], what: str, timeout: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting until {what}")


async def records(log: EventLog, stream: str, subjects: str | None = None) -> list[Recorded[Any]]:
    return [r async for r in log.replay(stream, subjects=subjects)]


async def wait_records(
    log: EventLog, stream: str, predicate: Callable[[list[Recorded[Any]]], Any], what: str
) -> list[Recorded[Any]]:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        found = await records(log, stream)
        if predicate(found):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; {stream} holds {[r.event for r in found]}")


def of(found: list[Recorded[Any]], kind: type, **fields: Any) -> list[Any]:
    """Events of ``kind`` whose fields match."""
    return [
        r.event
        for r in found
        if isinstance(r.event, kind) and all(getattr(r.event, k) == v for k, v in fields.items())
    ]


async def registered(log: EventLog, agent: AgentProcess) -> str:
    worker_id = await agent.worker_id()
    await wait_records(
        log,
        "WORKERS",
        lambda rs: any(r.subject == f"worker.{worker_id}.registered" for r in rs),
        "registered",
    )
    return worker_id


def coordinator(
    log: EventLog, name: str = "coordinator"
) -> contextlib.AbstractAsyncContextManager[Coordinator]:
    """A coordinator on its own connection (ticking every 0.1 s), running until the block ends."""
    return running(log.settings, name=name, tick_s=0.1)
