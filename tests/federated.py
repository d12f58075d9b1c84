"""Helpers for the federated tests: a workspace with an example's code and shards, and the kernel
services (coordinator, federation service) running in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from core.log import EventLog
from core.objects import s3_client
from core.settings import Settings
from core.streams import job_subject
from gateway.workspace import bucket_for, provision
from ops.coordinator import Coordinator
from ops.federation import FederationService
from schemas import FederatedTraining, JobResources, JobSubmitted
from tests.support import REPO

EXAMPLES = REPO / "examples"
TENANT = "acme"


def s3(settings: Settings) -> Any:
    return s3_client(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key)


def upload_example(settings: Settings, example: str, name: str, tmp: Path, *extra: str) -> None:
    """Upload ``examples/<example>/train.py`` and the shards its ``make_shards.py`` makes to job ``name``."""
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
) -> str:
    job_id = job_id or name
    event = JobSubmitted(
        name=name,
        kind="federated",
        shards=shards,
        rounds=rounds,
        local_epochs=local_epochs,
        resources=JobResources(),
        federated=FederatedTraining(
            script=f"jobs/{name}/scripts/train.py", args=args or [], framework=framework  # type: ignore[arg-type]
        ),
    )
    await log.append(job_subject(TENANT, job_id, event), event, event_id=f"submit-{job_id}")
    return job_id


@contextlib.asynccontextmanager
async def kernel(log: EventLog, root: Path) -> AsyncIterator[tuple[Coordinator, FederationService]]:
    """A coordinator and a federation service, each on its own connection, until the block ends."""
    coordinator_log = await EventLog.connect(log.settings, name="coordinator")
    federation_log = await EventLog.connect(log.settings, name="federation")
    coordinator = Coordinator(coordinator_log, tick_s=0.1)
    federation = FederationService(federation_log, root)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(coordinator.run(stop)), asyncio.create_task(federation.run(stop))]
    try:
        yield coordinator, federation
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        await coordinator_log.close()
        await federation_log.close()
