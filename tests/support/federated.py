"""Helpers for the federated tests: a workspace with an example's code and shards, and the kernel
services (coordinator, federation service) as processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.log import EventLog
from core.objects import bucket_for, provision, s3_client
from core.proctags import kill_tagged
from core.settings import Settings
from core.streams import job_subject
from ops.federation.server import TAG
from schemas.jobs import FederatedTraining, JobResources, JobSubmitted
from tests.support import REPO

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


class Kernel:
    """The coordinator and the federation service as processes (``resontech coordinator`` and
    ``resontech federation``), as the dev stack runs them: NVFlare's admin client threads must not
    share an event loop (and a GIL) with the coordinator's lost-worker detection."""

    def __init__(self, settings: Settings, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        self.env.update(env or {})
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
