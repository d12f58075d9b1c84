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

The sandboxed FL server writes the federation's directory (``prov/`` among it), so ``prov/`` is read
beneath the directory's fd, links left out and never followed (:class:`core.files.TenantTree`);
``project.yml``, the client kits, the archive id and the archive itself while it is written or read
are in the kernel's private directory, which no sandbox sees. An adopted archive is unpacked into a
directory emptied first (removing never follows a link), its ``project.yml`` and kits into the
private one: the archive's layout is unchanged.

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
    clear_private,
    configure_server,
    federation_tree,
    kill_federation,
    provision,
    provisioned_in,
    zip_beneath,
)
from ops.federation.workspace import fetch_object, list_keys

log = logging.getLogger("resontech.federation")

ARCHIVE_PREFIX = "_servers/"
"""Where archives live in the kit bucket: tenant ids are bucket-name material (no ``_``), so no
tenant's kits (``<tenant>/<job_id>/site-N.zip``) are under it."""
ID_FILE = "federation.id"
"""In a job's private directory: the archive key its federation came from (or was published as)."""
PARTS = ("project.yml", "prov", "kits")
PRIVATE_PARTS = ("project.yml", "kits")
"""The parts of an archive that are the kernel's own: unpacked into the private directory."""


async def federation(
    claims: ClaimKeeper,
    s3: Any,
    root: Path,
    private: Path,
    tenant: str,
    job_id: str,
    host: str,
    sites: list[str],
) -> Provisioned:
    """Job ``tenant/job_id``'s federation in ``root`` (the kernel's own files of it in ``private``):
    the one recorded on the log (adopted from its archive unless it is there already), else
    provisioned there (its clients dialling ``host``) and recorded before any client kit is handed
    out.

    Raises:
        ClaimLost: this instance does not hold the job (or could not record it yet).
        FederationError: provisioning failed, or the recorded archive is missing or unusable.
    """
    key = f"{tenant}/{job_id}"
    recorded = claims.provisioning(key)
    if recorded is not None and recorded.archive != local_id(private):
        kill_federation(root, key)
        prov = await asyncio.to_thread(adopt, s3, recorded.archive, root, private, sites)
        log.info("%s: serving the federation stored as %s", key, recorded.archive)
    else:
        prov = await asyncio.to_thread(
            provision, root, private, tenant=tenant, job_id=job_id, host=host, sites=sites
        )
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


def local_id(private: Path) -> str:
    """The archive the federation of the private directory ``private`` came from or was published
    as (empty if none)."""
    path = private / ID_FILE
    return path.read_text().strip() if path.exists() else ""


def publish(s3: Any, prov: Provisioned, key: str) -> None:
    """Upload the server side of the federation provisioned in ``prov.root`` as ``key``: the
    kernel's ``project.yml`` and kits, and ``prov/`` read beneath the federation's fd.

    Raises:
        FederationError: a file of ``prov/`` is not a plain file of the tree (a hard link, huge).
    """
    private = prov.private
    archive = private / "tmp" / "federation.zip"
    archive.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    server_side = archive.with_name("prov.zip")
    with federation_tree(prov.root) as tree:
        zip_beneath(tree, "prov", server_side, skip=lambda name: name.split("/")[1:2] == ["state"])
    try:
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
            out.write(private / "project.yml", "project.yml")
            for kit in sorted((private / "kits").iterdir()):
                out.write(kit, f"kits/{kit.name}")
            with zipfile.ZipFile(server_side) as inner:
                for name in inner.namelist():  # the root CA's key (prov/<project>/state) was left out
                    out.writestr(f"prov/{name}", inner.read(name))
        provision_bucket(s3, flare.KIT_BUCKET)
        s3.upload_file(str(archive), flare.KIT_BUCKET, key)
    finally:
        archive.unlink(missing_ok=True)
        server_side.unlink(missing_ok=True)
    (private / ID_FILE).write_text(key)


def adopt(s3: Any, key: str, root: Path, private: Path, sites: list[str]) -> Provisioned:
    """Replace whatever is in ``root`` (and the kernel's files in ``private``) with the federation
    stored as ``key``.

    Raises:
        FederationError: the archive is missing or unusable.
    """
    shutil.rmtree(root, ignore_errors=True)  # never follows a link the previous server left
    clear_private(private)
    (root / "tmp").mkdir(parents=True)
    (private / "tmp").mkdir(mode=0o700, exist_ok=True)
    archive = fetch_object(s3, flare.KIT_BUCKET, key, private / "tmp" / "federation.zip", "the federation")
    try:
        with zipfile.ZipFile(archive) as source:
            members = source.infolist()
            for member in members:
                name = member.filename
                if name.startswith("/") or ".." in Path(name).parts or name.split("/", 1)[0] not in PARTS:
                    raise FederationError(f"the federation archive {key} holds {name!r}")
            for member in members:
                mine = member.filename.split("/", 1)[0] in PRIVATE_PARTS
                source.extract(member, private if mine else root)
    except zipfile.BadZipFile:
        raise FederationError(f"the federation archive {key} is not a ZIP") from None
    finally:
        archive.unlink(missing_ok=True)
    prov = provisioned_in(root, private, sites)
    if prov is None:
        raise FederationError(f"the federation archive {key} holds no provisioned federation")
    configure_server(prov)
    (private / ID_FILE).write_text(key)
    return prov


def delete_archives(s3: Any, tenant: str, job_id: str) -> None:
    """Delete every archive of a job's federation (its job ended)."""
    for key, _ in list_keys(s3, flare.KIT_BUCKET, f"{ARCHIVE_PREFIX}{tenant}/{job_id}/"):
        s3.delete_object(Bucket=flare.KIT_BUCKET, Key=key)
