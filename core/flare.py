"""The pure parts of a federated job's federation on NVFlare 2.9: who is who, the provisioning
project, the FL server's local resources, and what a run's status means (each run's FL job folder is
:mod:`core.flarejob`'s).

One federation per job: ``nvflare provision`` of :func:`project` gives the job its own root CA, one
server and one client identity per slot (``site-1`` .. ``site-N``, whichever worker runs the slot),
and the kernel's admin identity (:data:`ADMIN_USER`, a project admin; never NVFlare's default
``admin@nvidia.com``). The server participant is named after the host the clients dial: NVFlare binds
a server named ``localhost`` (or any loopback name) to loopback only, and any other name to every
interface. The FL and admin traffic share one port.

Nothing here touches the disk or NVFlare; :mod:`ops.federation` writes what these functions return.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from core.errors import ResontechError

ORG = "resontech"
ADMIN_USER = "kernel@resontech.local"
"""The kernel's identity on every federation's admin port (role ``project_admin``)."""
KIT_FILE = "startup-kit.zip"
"""A client's startup kit's name in its assignment's downloads (the shard's is its workspace key)."""
KIT_BUCKET = "resontech-federations"
"""The kernel's bucket for client startup kits. Tenant buckets are ``rt-<tenant>``: no tenant can own it."""
SERVER_ERROR_LOG = "error_log.txt"
"""The FL server's error log of a run, in ``<server workspace>/<run id>/``."""
ROUND_FILE = re.compile(r"^round-(\d{5})\.json$")
DEFAULT_HEARTBEAT_TIMEOUT_S = 10.0
"""How long the FL server keeps a silent client registered (NVFlare's default is 600 s): a replacement
client with the same name registers at once anyway; this only bounds how long a dead one is listed."""

RunOutcome = Literal["running", "completed", "failed", "aborted"]


class ShardsMissing(ResontechError, ValueError):
    """The workspace lacks shard ZIPs for some slots; the message names what is missing."""

    code = "shards_missing"


def site_name(slot: int) -> str:
    """The NVFlare client name of ``slot`` (0-based): ``site-1`` for slot 0."""
    return f"site-{slot + 1}"


def project_name(tenant: str, job_id: str) -> str:
    """The NVFlare project of a job's federation (also its FL server's name)."""
    return f"{tenant}-{job_id}"


def kit_key(tenant: str, job_id: str, site: str) -> str:
    """Object key, in :data:`KIT_BUCKET`, of one client's startup kit ZIP."""
    return f"{tenant}/{job_id}/{site}.zip"


def project(name: str, *, host: str, port: int, sites: Iterable[str]) -> dict[str, Any]:
    """The ``project.yml`` (as a dict) that provisions one job's federation.

    Args:
        name: :func:`project_name`.
        host: the server's name, which is the host the clients dial (``localhost`` in the dev stack).
        port: the server's port, FL and admin traffic alike.
        sites: the client names, in slot order.
    """
    server = {"name": host, "type": "server", "org": ORG, "fed_learn_port": port, "admin_port": port}
    clients = [{"name": site, "type": "client", "org": ORG} for site in sites]
    admin = {"name": ADMIN_USER, "type": "admin", "org": ORG, "role": "project_admin"}
    return {
        "api_version": 3,
        "name": name,
        "description": f"resontech federation of job {name}",
        "participants": [server, *clients, admin],
        "builders": [
            {"path": "nvflare.lighter.impl.workspace.WorkspaceBuilder"},
            {
                "path": "nvflare.lighter.impl.static_file.StaticFileBuilder",
                "args": {"config_folder": "config"},
            },
            {"path": "nvflare.lighter.impl.cert.CertBuilder"},
            {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
        ],
    }


def server_resources(
    provisioned: dict[str, Any], *, jobs_dir: str, heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
) -> dict[str, Any]:
    """The FL server's ``local/resources.json``, from the provisioned ``resources.json.default``.

    * Job storage moves from NVFlare's shared ``/tmp/nvflare/jobs-storage`` into ``jobs_dir``.
    * The snapshot persistor (also under ``/tmp/nvflare``) goes: after a crash the kernel restarts
      the run itself, from the last global model it checkpointed, rather than have NVFlare resume a
      half-finished round from its own snapshot.
    * The job scheduler retries every second (NVFlare waits 10 s between attempts) and two jobs run
      at a time: a federation serves one kernel job, whose next run starts while the run it aborted
      (a site lost) is still being torn down, which takes NVFlare several seconds.
    * A silent client is dropped after ``heartbeat_timeout_s``.
    """
    resources = {k: v for k, v in provisioned.items() if k != "snapshot_persistor"}
    resources["servers"] = [
        {**server, "heart_beat_timeout": heartbeat_timeout_s} for server in provisioned.get("servers", [{}])
    ]
    components = []
    for component in provisioned.get("components", []):
        args = dict(component.get("args", {}))
        if component.get("id") == "job_manager":
            args["uri_root"] = jobs_dir
        elif component.get("id") == "job_scheduler":
            args.update(
                max_jobs=2, min_schedule_interval=1.0, max_schedule_interval=2.0, max_schedule_count=600
            )
        components.append({**component, "args": args})
    resources["components"] = components
    return resources


def shard_keys(keys: Iterable[str], prefix: str, shards: int) -> list[str]:
    """The shard ZIP of each slot: the ``.zip`` objects directly under ``prefix``, in name order; none
    at all when there is none (shards are optional: a job whose training code reads no data, or makes
    its own, has its sites start with an empty data folder).

    Raises:
        ShardsMissing: some ZIPs are there, but fewer than ``shards``.
    """
    found = sorted(
        k for k in keys if k.startswith(prefix) and k.endswith(".zip") and "/" not in k[len(prefix) :]
    )
    if 0 < len(found) < shards:
        missing = ", ".join(f"slot {slot}" for slot in range(len(found), shards))
        raise ShardsMissing(
            f"the job has {shards} shards but {prefix} holds {len(found)} shard ZIP(s): "
            f"nothing for {missing} (upload one ZIP per shard, or none for training code that reads no data)"
        )
    return found[:shards]


def run_outcome(status: str | None) -> RunOutcome:
    """What an NVFlare job status means for the kernel.

    ``SUBMITTED``/``DISPATCHED``/``RUNNING`` (or nothing yet) are ``running``; ``FINISHED:COMPLETED``
    is ``completed``; ``FINISHED:ABORTED`` is ``aborted`` (the kernel aborts runs it replaces);
    every other ``FINISHED:...`` (``EXECUTION_EXCEPTION``, ``ABNORMAL``...) is ``failed``.
    """
    if not status or not status.startswith("FINISHED"):
        return "running"
    if status == "FINISHED:COMPLETED":
        return "completed"
    if status == "FINISHED:ABORTED":
        return "aborted"
    return "failed"


def round_of(file_name: str) -> int | None:
    """The 1-based round of a ``round-NNNNN.json`` the server wrote, else ``None``."""
    match = ROUND_FILE.match(file_name)
    return int(match.group(1)) if match else None


def round_stem(round_number: int) -> str:
    """``round-00003`` for round 3: the stem of that round's ``.npz`` and ``.json``."""
    return f"round-{round_number:05d}"


def error_excerpt(log: str, lines: int = 40) -> tuple[str, str]:
    """The reason line and the tail of a client's error log (NVFlare's ``ERRORLOG_<site>``).

    The reason is the last line that looks like a Python exception (``ValueError: ...``), else the
    last non-empty line.
    """
    text = [line for line in log.splitlines() if line.strip()]
    reason = next(
        (line.strip() for line in reversed(text) if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*", line)),
        text[-1].strip() if text else "",
    )
    return reason, "\n".join(text[-lines:])
