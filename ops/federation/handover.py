"""A job's federation handed from one federation service instance to the next.

The clients of a federated job hold startup kits of one provisioning (its root CA, their own
certificates, the server's name and port). So that they survive a takeover without being restarted,
the instance that takes a job over serves the *same* federation: the first holder stores its server
side (``project.yml``, the server's and the kernel's startup kits, the client kits) as a ZIP in the
kernel's kit bucket under :func:`archive_key` and says so on the log (``federation.provisioned``)
before any client kit is handed out; the next holder downloads it into its own directory, points the
server's job store there (:func:`ops.federation.server.configure_server`) and starts the server at
the same address. NVFlare's clients reconnect by themselves, as after a restart of the server.

The archive holds the server's private key and the kernel's admin key for that job, as the kit bucket
already holds each client's: the bucket is the kernel's alone (tenant buckets are ``rt-<tenant>``).
It is deleted with the kits when the job ends. The root CA's own key (``prov/<project>/state``) is not
in it: serving needs none.

Every call but :func:`federation` blocks: callers run them in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import zipfile
from pathlib import Path
from typing import Any

from core import flare
from core.objects import provision as provision_bucket
from ops.federation.claims import ClaimKeeper, ClaimLost
from ops.federation.server import (
    FederationError,
    Provisioned,
    configure_server,
    kill_federation,
    provision,
    provisioned_in,
)
from ops.federation.workspace import fetch_object, list_keys

log = logging.getLogger("resontech.federation")

ARCHIVE_PREFIX = "_servers/"
"""Where archives live in the kit bucket: tenant ids are bucket-name material (no ``_``), so no
tenant's kits (``<tenant>/<job_id>/site-N.zip``) are under it."""
ID_FILE = "federation.id"
"""In a job's directory: the archive key its federation came from (or was published as)."""
PARTS = ("project.yml", "prov", "kits")


async def federation(
    claims: ClaimKeeper, s3: Any, root: Path, tenant: str, job_id: str, host: str, sites: list[str]
) -> Provisioned:
    """Job ``tenant/job_id``'s federation in ``root``: the one recorded on the log (adopted from its
    archive unless it is there already), else provisioned there (its clients dialling ``host``) and
    recorded before any client kit is handed out.

    Raises:
        ClaimLost: this instance does not hold the job (or could not record it yet).
        FederationError: provisioning failed, or the recorded archive is missing or unusable.
    """
    key = f"{tenant}/{job_id}"
    recorded = claims.provisioning(key)
    if recorded is not None and recorded.archive != local_id(root):
        kill_federation(root, key)
        prov = await asyncio.to_thread(adopt, s3, recorded.archive, root, sites)
        log.info("%s: serving the federation stored as %s", key, recorded.archive)
    else:
        prov = await asyncio.to_thread(provision, root, tenant=tenant, job_id=job_id, host=host, sites=sites)
    if prov.host != host:
        log.warning("%s: its clients dial %s, not %s: that name must reach this host", key, prov.host, host)
    if recorded is not None:
        return prov
    holder = claims.holder(key)
    if holder is None or not claims.holds(key):
        raise ClaimLost("another instance holds it now")
    archive = archive_key(tenant, job_id, holder.incarnation, holder.term)
    await asyncio.to_thread(publish, s3, prov, archive)
    if not await claims.record_provisioned(key, archive, f"{prov.host}:{prov.port}"):
        # still held: the stream kept moving under it; the service starts the federation again
        raise ClaimLost(
            "its federation could not be recorded yet"
            if claims.holds(key)
            else "another instance holds it now"
        )
    return prov


def archive_key(tenant: str, job_id: str, incarnation: str, term: int) -> str:
    """The key of a job's federation archive, unique to the claim that provisioned it (a holder that
    lost its claim mid-upload writes over nobody's)."""
    return f"{ARCHIVE_PREFIX}{tenant}/{job_id}/{incarnation}-{term}.zip"


def local_id(root: Path) -> str:
    """The archive the federation in ``root`` came from or was published as (empty if none)."""
    path = root / ID_FILE
    return path.read_text().strip() if path.exists() else ""


def publish(s3: Any, prov: Provisioned, key: str) -> None:
    """Upload the server side of the federation provisioned in ``prov.root`` as ``key``."""
    root = prov.root
    archive = root / "tmp" / "federation.zip"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for part in PARTS:
            path = root / part
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for file in files:
                relative = file.relative_to(root)
                if relative.parts[:1] == ("prov",) and "state" in relative.parts[2:3]:
                    continue  # the root CA's key: not needed to serve
                out.write(file, relative.as_posix())
    provision_bucket(s3, flare.KIT_BUCKET)
    s3.upload_file(str(archive), flare.KIT_BUCKET, key)
    archive.unlink()
    (root / ID_FILE).write_text(key)


def adopt(s3: Any, key: str, root: Path, sites: list[str]) -> Provisioned:
    """Replace whatever is in ``root`` with the federation stored as ``key``.

    Raises:
        FederationError: the archive is missing or unusable.
    """
    shutil.rmtree(root, ignore_errors=True)
    (root / "tmp").mkdir(parents=True)
    archive = fetch_object(s3, flare.KIT_BUCKET, key, root / "tmp" / "federation.zip", "the federation")
    try:
        with zipfile.ZipFile(archive) as source:
            for name in source.namelist():
                if name.startswith("/") or ".." in Path(name).parts or name.split("/", 1)[0] not in PARTS:
                    raise FederationError(f"the federation archive {key} holds {name!r}")
            source.extractall(root)
    except zipfile.BadZipFile:
        raise FederationError(f"the federation archive {key} is not a ZIP") from None
    archive.unlink()
    prov = provisioned_in(root, sites)
    if prov is None:
        raise FederationError(f"the federation archive {key} holds no provisioned federation")
    configure_server(prov)
    (root / ID_FILE).write_text(key)
    return prov


def delete_archives(s3: Any, tenant: str, job_id: str) -> None:
    """Delete every archive of a job's federation (its job ended)."""
    for key, _ in list_keys(s3, flare.KIT_BUCKET, f"{ARCHIVE_PREFIX}{tenant}/{job_id}/"):
        s3.delete_object(Bucket=flare.KIT_BUCKET, Key=key)
