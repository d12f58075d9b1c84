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

import nats
import nats.js.errors

from agent.runtimes.process import reap_orphans
from agent.settings import default_work_dir
from core.addresses import LOOPBACK_NETWORKS
from core.log import EventLog
from core.settings import Settings
from core.streams import STREAMS, endpoint_subject, job_subject, worker_subject
from ops.coordinator import Coordinator, running
from ops.enrollment import enroll_state_dir
from schemas.commands import StartWork
from schemas.endpoints import EndpointDeployed, EndpointReplicaPlaced
from schemas.envelope import Recorded
from schemas.jobs import JobPlaced, JobResources, JobSubmitted
from schemas.values import Assignment, Provenance
from schemas.workers import WorkerVerified

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60.0
"""How long a test waits for what the code promises to do eventually (a process registered, a job
placed): a deadline, never a figure. A passing test returns as soon as it sees it; on a busy 2-core
machine starting Python processes alone took more than 20 s."""
VERIFICATION_TIMEOUT_S = 120.0
"""A new agent's verification job is a CPU benchmark (its own deadline is 120 s): on a busy machine it
takes longer than other steps."""


WARM_ENGINES = "0"
"""Agents in tests keep no warm engine (each imports torch and vLLM: 9 s of one of this host's two
cores) unless a test asks for one (``--warm-engines``)."""


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
            RESONTECH_AGENT_WARM_ENGINES=WARM_ENGINES,
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

    @property
    def work_dir(self) -> Path:
        """Where its workloads' working directories are: beside its state dir, never in it."""
        return default_work_dir(self.state_dir)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        reap_orphans(self.work_dir)

    @property
    def simulated_gpus(self) -> bool:
        """Whether the agent runs on simulated GPUs (``--devices simulated``: load tests only)."""
        flags = " ".join(self.extra)
        return "--devices simulated" in flags or self.env.get("RESONTECH_AGENT_DEVICE_SOURCE") == "simulated"

    def identity(self) -> dict[str, str | None]:
        """What the agent registers as, from its flags and environment (the enrollment must say the
        same, or the intake refuses its registration)."""
        found: dict[str, str | None] = {
            name: self.env.get(f"RESONTECH_AGENT_{name.upper()}") or None
            for name in ("provider", "pool", "region", "owner_tenant")
        }
        for i, arg in enumerate(self.extra[:-1]):
            if arg in ("--provider", "--pool", "--region", "--owner-tenant"):
                found[arg[2:].replace("-", "_")] = self.extra[i + 1]
        return found

    def enroll(self, settings: Settings) -> str:
        """Record the agent's enrollment as the operator (it runs with the kernel's credentials),
        before it starts; returns its worker id."""
        who = self.identity()
        return enroll_state_dir(
            settings,
            self.state_dir,
            provider=who["provider"] or "local",
            pool=who["pool"] or "shared",
            region=who["region"] or "",
            owner_tenant=who["owner_tenant"],
        )


class IntakeProcess:
    """``python -m ops.cli intake``: the kernel service that turns agents' claims into events."""

    def __init__(self, root: Path, nats_url: str, replica_networks: str = LOOPBACK_NETWORKS) -> None:
        self.stderr_path = root / "intake.stderr"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        self.env.update(
            RESONTECH_NATS_URL=nats_url,
            RESONTECH_DATA_DIR=str(root),
            RESONTECH_REPLICA_NETWORKS=replica_networks,
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> IntakeProcess:
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", "intake"], cwd=REPO, env=self.env, stdout=err, stderr=err
            )
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""


async def wipe_streams(url: str, user: str | None = None, password: str | None = None) -> None:
    """Delete every stream and snapshot so a test starts from an empty log."""
    nc = await nats.connect(url, user=user, password=password)
    js = nc.jetstream()
    for spec in STREAMS:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(spec.name)
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_object_store("snapshots")
    await nc.close()


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
    log: EventLog,
    stream: str,
    predicate: Callable[[list[Recorded[Any]]], Any],
    what: str,
    timeout_s: float = TIMEOUT_S,
) -> list[Recorded[Any]]:
    deadline = time.monotonic() + timeout_s
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
    """The agent's worker id once the kernel registered it and it passed its verification job: a
    worker ready for tenant work. An agent on simulated GPUs cannot pass (NVML shows its verification
    job no GPU, exactly as for a spoofed host): the operator vouches for it instead, as the test's
    kernel."""
    worker_id = await agent.worker_id()
    if agent.simulated_gpus:
        await wait_records(
            log,
            "WORKERS",
            lambda rs: any(r.subject == f"worker.{worker_id}.registered" for r in rs),
            "registered",
        )
        await log.append(
            worker_subject(worker_id, WorkerVerified), WorkerVerified(by="operator: simulated GPUs")
        )
    await wait_records(
        log,
        "WORKERS",
        lambda rs: any(r.subject == f"worker.{worker_id}.verified" for r in rs),
        f"worker {worker_id} registered and verified",
        VERIFICATION_TIMEOUT_S,
    )
    return worker_id


async def place(log: EventLog, worker_id: str, cmd: StartWork) -> None:
    """Append what the kernel has stored before it sends ``cmd``: the work's submission (once per work
    id) and the placement of the command's assignment on ``worker_id`` (the intake accepts reports
    about current assignments only). For tests that drive an agent by hand, without a coordinator."""
    assignment = Assignment(
        assignment_id=cmd.assignment_id,
        worker_id=worker_id,
        slot=cmd.slot,
        epoch=cmd.epoch,
        gpus=cmd.spec.gpus,
    )
    provenance = Provenance(candidates=1, policy="test")
    work: list[tuple[str, Any, str]]
    if cmd.work_kind == "job":
        resources = JobResources(gpus=cmd.spec.gpus, cpus=cmd.spec.cpus)
        submitted = JobSubmitted(
            name=cmd.work_id, kind="process", shards=HAND_PLACED_SHARDS, resources=resources
        )
        placed: Any = JobPlaced(assignments=[assignment], provenance=provenance)
        work = [
            (
                job_subject(cmd.tenant, cmd.work_id, submitted),
                submitted,
                f"submit-{cmd.tenant}-{cmd.work_id}",
            ),
            (job_subject(cmd.tenant, cmd.work_id, placed), placed, f"place-{cmd.assignment_id}"),
        ]
    else:
        deployed = EndpointDeployed(
            name=cmd.work_id, model=cmd.spec.options.get("model", "m"), max_replicas=8
        )
        placed = EndpointReplicaPlaced(assignments=[assignment], provenance=provenance)
        work = [
            (
                endpoint_subject(cmd.tenant, cmd.work_id, deployed),
                deployed,
                f"deploy-{cmd.tenant}-{cmd.work_id}",
            ),
            (endpoint_subject(cmd.tenant, cmd.work_id, placed), placed, f"place-{cmd.assignment_id}"),
        ]
    for subject, event, event_id in work:
        await log.append(subject, event, event_id=event_id)


HAND_PLACED_SHARDS = 8
"""Shards of a job :func:`place` submits: room for every slot a test uses."""


def coordinator(
    log: EventLog, name: str = "coordinator"
) -> contextlib.AbstractAsyncContextManager[Coordinator]:
    """A coordinator on its own connection (ticking every 0.1 s), running until the block ends."""
    return running(log.settings, name=name, tick_s=0.1)
