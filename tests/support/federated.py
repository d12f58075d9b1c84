"""Helpers for the federated tests: a workspace with an example's code and shards, the kernel
services (coordinator, federation service) as processes, waiting on a job's records and on its
processes to stop, and FedAvg computed by hand to check a trained model against."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from core.log import EventLog
from core.objects import bucket_for, provision, s3_client
from core.proctags import kill_tagged, tagged_pids
from core.settings import Settings
from core.streams import job_subject
from ops.federation.server import TAG
from schemas.jobs import FederatedTraining, JobFailed, JobPlaced, JobResources, JobSubmitted
from tests.support import REPO, of, records

EXAMPLES = REPO / "examples"
TENANT = "acme"


def s3(settings: Settings) -> Any:
    return s3_client(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key)


def read_object(settings: Settings, key: str) -> bytes:
    """An object of the tenant's workspace."""
    body: bytes = s3(settings).get_object(Bucket=bucket_for(TENANT), Key=key)["Body"].read()
    return body


def upload(settings: Settings, key: str, body: bytes) -> None:
    """Put one object in the tenant's workspace."""
    client = s3(settings)
    provision(client, bucket_for(TENANT))
    client.put_object(Bucket=bucket_for(TENANT), Key=key, Body=body)


def upload_example(settings: Settings, example: str, name: str, tmp: Path, *extra: str) -> None:
    """Upload an example's scripts (to ``jobs/<name>/scripts/``) and what its ``make_shards.py`` makes:
    shard ZIPs (to ``shards/``) and an initial model (to ``init/``)."""
    client = s3(settings)
    bucket = bucket_for(TENANT)
    provision(client, bucket)
    shards = tmp / f"{name}-shards"
    subprocess.run(
        [sys.executable, str(EXAMPLES / example / "make_shards.py"), str(shards), *extra],
        check=True,
        capture_output=True,
    )
    for path in sorted(EXAMPLES.glob(f"{example}/*.py")):
        if path.name != "make_shards.py":
            client.upload_file(str(path), bucket, f"jobs/{name}/scripts/{path.name}")
    for path in sorted(shards.glob("*.zip")):
        client.upload_file(str(path), bucket, f"jobs/{name}/shards/{path.name}")
    for path in sorted(shards.glob("*.pt")):
        client.upload_file(str(path), bucket, f"jobs/{name}/init/{path.name}")


def upload_folder(settings: Settings, folder: Path, prefix: str) -> None:
    """Put every file under ``folder`` in the tenant's workspace under ``prefix``."""
    client = s3(settings)
    provision(client, bucket_for(TENANT))
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            client.upload_file(str(path), bucket_for(TENANT), prefix + path.relative_to(folder).as_posix())


async def submit(
    log: EventLog,
    name: str,
    *,
    shards: int = 2,
    rounds: int = 2,
    local_epochs: int = 1,
    framework: str = "numpy",
    args: list[str] | None = None,
    job_id: str | None = None,
    initial_model: str | None = None,
    job_folder: str | None = None,
    persistor: str | None = None,
    cpus: float = 1.0,
) -> str:
    """Submit a federated job whose script is ``jobs/<name>/scripts/train.py`` (or ``job_folder``)."""
    job_id = job_id or name
    event = JobSubmitted(
        name=name,
        kind="federated",
        shards=shards,
        rounds=rounds,
        local_epochs=local_epochs,
        resources=JobResources(cpus=cpus),
        federated=FederatedTraining(
            script="" if job_folder else f"jobs/{name}/scripts/train.py",
            args=args or [],
            framework=framework,  # type: ignore[arg-type]
            initial_model=initial_model,
            job_folder=job_folder,
            persistor=persistor,
        ),
    )
    await log.append(job_subject(TENANT, job_id, event), event, event_id=f"submit-{job_id}")
    return job_id


TEST_LEASE_S = "20"
"""The federation service's claim lease here (the default is 8 s). On a loaded machine (a CI run beside
other work) the service went 8 s without a stored renewal now and then: it fenced its own FL server and
started the run again, correctly, but these tests check runs that nothing interrupted. The tests of
lapses and takeovers (``tests/e2e/training/test_federation_claims.py``) run their own instances."""


class Kernel:
    """The coordinator and the federation service as processes (``resontech coordinator`` and
    ``resontech federation``), as the dev stack runs them: NVFlare's admin client threads must not
    share an event loop (and a GIL) with the coordinator's lost-worker detection."""

    def __init__(self, settings: Settings, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        self.env.update({"RESONTECH_FEDERATION_LEASE_S": TEST_LEASE_S, **(env or {})})
        self.env.update(
            RESONTECH_NATS_URL=settings.nats_url,
            RESONTECH_S3_ENDPOINT=settings.s3_endpoint,
            RESONTECH_S3_ACCESS_KEY=settings.s3_access_key,
            RESONTECH_S3_SECRET_KEY=settings.s3_secret_key,
            RESONTECH_DATA_DIR=str(data_dir),
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def federations(self) -> Path:
        return self.data_dir / "federations"

    def start(self, service: str) -> None:
        log_file = self.data_dir / f"{service}.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as out:
            self.procs[service] = subprocess.Popen(
                [sys.executable, "-m", "ops.cli", service], cwd=REPO, env=self.env, stdout=out, stderr=out
            )

    def kill(self, service: str) -> None:
        """SIGKILL a service (what it started in sessions of their own lives on)."""
        proc = self.procs.pop(service)
        proc.kill()
        proc.wait()

    def stop(self, service: str) -> None:
        proc = self.procs.pop(service)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def logs(self, service: str) -> str:
        path = self.data_dir / f"{service}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def kernel(settings: Settings, data_dir: Path, env: dict[str, str] | None = None) -> Iterator[Kernel]:
    """A coordinator and a federation service running until the block ends (``env``: more of their
    environment)."""
    k = Kernel(settings, data_dir, env)
    k.start("coordinator")
    k.start("federation")
    try:
        yield k
    finally:
        for service in list(k.procs):
            k.stop(service)
        for job_dir in k.federations.glob("*/*"):  # nothing of NVFlare outlives the test
            kill_tagged(TAG, f"{job_dir.parent.name}/{job_dir.name}")


HEARTBEAT = ("--heartbeat", "2.0")
"""Agents beat every 2 s (lost after 6 s of silence): NVFlare keeps these two cores busy, and at 1 s a
loaded machine lost a healthy client's host now and then (its client was placed again)."""


async def wait_for(
    log: EventLog, kind: type, what: str, timeout: float = 120.0, subjects: str | None = None
) -> list[Any]:
    """The JOBS records once one of ``kind`` is there (or the job failed)."""
    deadline = time.monotonic() + timeout
    found: list[Any] = []
    while time.monotonic() < deadline:
        found = await records(log, "JOBS", subjects)
        if of(found, kind) or of(found, JobFailed, slot=None):
            return found
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}: {[r.event for r in found][-15:]}")


def fedavg_by_hand(
    shards: Path, *, rounds: int, epochs: int, lr: float, w0: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """What the example's FedAvg computes, without NVFlare: each site's gradient descent from the global
    model (at first every weight ``w0``, the bias 0), then the average weighted by sample count."""
    sites = []
    for path in sorted(shards.glob("shard-*.zip")):
        with zipfile.ZipFile(path) as archive, np.load(io.BytesIO(archive.read("data.npz"))) as data:
            sites.append((data["x"], data["y"]))
    w, b = np.full(sites[0][0].shape[1], w0), np.zeros(1)
    for _ in range(rounds):
        results = []
        for x, y in sites:
            lw, lb = w, b
            for _ in range(epochs):
                error = x @ lw + lb - y
                lw, lb = lw - lr * 2 * x.T @ error / len(y), lb - lr * 2 * np.mean(error, keepdims=True)
            results.append((lw, lb, len(y)))
        total = sum(n for _, _, n in results)
        w = sum(lw * n for lw, _, n in results) / total
        b = sum(lb * n for _, lb, n in results) / total
    return w, b


def _cmdline(pid: int) -> str:
    """What a process runs (empty once it has exited)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return ""


async def all_stopped(found: list[Any], job: str, timeout: float = 45.0) -> None:
    """Every client of the job and its FL server are gone (the job's end stops them)."""
    assignments = [a.assignment_id for placed in of(found, JobPlaced) for a in placed.assignments]

    def left() -> list[str]:
        pids = [p for a in assignments for p in tagged_pids("RESONTECH_ASSIGNMENT_ID", a)]
        pids += tagged_pids(TAG, f"{TENANT}/{job}")
        return [line for p in pids if (line := _cmdline(p))]

    deadline = time.monotonic() + timeout
    while (still := left()) and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    assert not still, f"still running {timeout:.0f}s after the job ended: {still}"
