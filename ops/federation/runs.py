"""One FL run of a federated job: the run in flight, when the next may start, which sites a run lost,
and why a run failed.

A federation submits a run (NVFlare's job) once every slot's current assignment has started and every
site has connected since it was last (re)started; a run whose slot changed worker cannot take the new
client in, so it is aborted and the next run redoes the round in flight. A failed run's reason comes
from the logs NVFlare leaves in the server's workspace.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from core import flare
from core.files import TenantTree, UnsafeFile
from ops.federation.server import FederationError, FlareAdmin, Provisioned
from projections.schedule import JobRecord

MAX_ERROR_LOG_BYTES = 256 * 1024
"""How much of the end of an error log is read."""
ERROR_LOG_WAIT_S = 8.0
"""After a failed run, how long to wait for the failing client's error log to reach the server."""


@dataclass
class Run:
    """The FL run in flight."""

    run_id: str
    number: int
    first_round: int
    rounds: int
    epochs: dict[str, int]


async def sites_ready(
    admin: FlareAdmin, prov: Provisioned, job: JobRecord, fresh_since: dict[str, float]
) -> bool:
    """Every slot's current assignment started, and every site connected (recently enough: since
    ``fresh_since[site]``, a time in seconds since the epoch)."""
    for slot in range(job.spec.shards):
        assignment = job.assignments.get(str(slot))
        if assignment is None or job.started.get(str(slot)) != assignment.epoch:
            return False
    try:
        clients = await admin.call(lambda s: s.get_connected_client_list())
    except FederationError:
        return False
    latest: dict[str, float] = {}
    for client in clients:
        latest[client.name] = max(latest.get(client.name, 0.0), float(client.last_connect_time or 0.0))
    return all(latest.get(site, -1.0) >= fresh_since.get(site, 0.0) for site in prov.sites)


def replaced_sites(run: Run, job: JobRecord) -> list[str]:
    """The sites whose slot has no assignment, or another one, since ``run`` was submitted."""
    lost = []
    for slot, epoch in run.epochs.items():
        current = job.assignments.get(slot)
        if current is None or current.epoch != epoch:
            lost.append(flare.site_name(int(slot)))
    return lost


async def run_failure(prov: Provisioned, run_id: str, status: str) -> tuple[str, str]:
    """Why a run failed: the first client error log the server received, else the server's own
    error log (the tenant's persistor or job folder failing there), else the status."""
    deadline = time.monotonic() + ERROR_LOG_WAIT_S
    server_dir = prov.server_dir.relative_to(prov.root).as_posix()
    while True:
        for slot, site in enumerate(prov.sites):
            text = _read(prov.root, f"jobs/{run_id}/ERRORLOG_{site}")
            if text.strip():
                reason, tail = flare.error_excerpt(text)
                return f"training failed on {site} (shard {slot}): {reason}", tail
        if time.monotonic() >= deadline:
            text = _read(prov.root, f"{server_dir}/{run_id}/{flare.SERVER_ERROR_LOG}")
            if text.strip():
                reason, tail = flare.error_excerpt(text)
                return f"the FL server's run failed: {reason}", tail
            return f"FL run {run_id} ended {status}", ""
        await asyncio.sleep(0.5)


def _read(root: Path, relpath: str) -> str:
    """The last :data:`MAX_ERROR_LOG_BYTES` of an error log the sandboxed server wrote (empty if it
    is missing, or not a plain file: it is read beneath the federation's fd, never through a link,
    since its text goes into the job's failure, which the tenant reads)."""
    try:
        with TenantTree.open(root) as tree:
            return tree.tail_bytes(relpath, MAX_ERROR_LOG_BYTES).decode(errors="replace")
    except UnsafeFile:
        return ""
