"""A federated job's FL job folder on the kernel's disk: the tenant's training code fetched once into
``<federation>/job/`` (:func:`prepare`), and each run's copy of it with the run's documents and the
kernel's server components (:func:`write_run`). The rules are :mod:`core.flarejob`'s.

What ``job/`` holds:

* a Client API script: ``app_client/custom/`` is the script's folder (the script and what sits
  beside and below it); with a ``persistor``, ``app_server/custom/`` is the persistor's folder;
* a job folder: the tenant's folder as it is in the workspace.

Every call blocks (boto3, the disk): callers run them in a thread.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from core import flarejob
from ops.federation import workspace as ws
from ops.federation.server import FederationError
from schemas.jobs import FederatedTraining

COMPONENT_SOURCE = Path(__file__).with_name(f"{flarejob.COMPONENT_MODULE}.py")


def prepare(s3: Any, tenant: str, spec: FederatedTraining, sites: list[str], dest: Path) -> flarejob.FlJob:
    """Fetch the job's training code into ``dest`` and describe the job folder it makes.

    Raises:
        FederationError: the code is missing or too large, or the job folder cannot run (the
            message names the folder and what to fix).
    """
    shutil.rmtree(dest, ignore_errors=True)
    if spec.job_folder:
        names = ws.fetch_folder(s3, tenant, spec.job_folder, dest, "the job folder")
        files = {name: (dest / name).read_bytes() for name in flarejob.config_paths(names)}
        try:
            return flarejob.tenant_job(files, sites)
        except flarejob.JobFolderInvalid as exc:
            raise FederationError(f"job folder {spec.job_folder}: {exc}") from None
    folder = _folder_of(spec.script)
    ws.fetch_folder(
        s3, tenant, folder, dest / flarejob.CLIENT_APP / "custom", "the training script", spec.script
    )
    persistor = None
    if spec.persistor:
        try:
            persistor = flarejob.persistor_ref(spec.persistor)
        except ValueError as exc:
            raise FederationError(str(exc)) from None
        custom = dest / flarejob.SERVER_APP / "custom"
        ws.fetch_folder(s3, tenant, persistor.folder, custom, "the persistor", persistor.key)
    return flarejob.script_job(
        sites=sites,
        script=spec.script[len(folder) :],
        script_args=list(spec.args),
        framework=spec.framework,
        persistor=persistor,
    )


def _folder_of(key: str) -> str:
    return key.rpartition("/")[0] + "/" if "/" in key else ""


def write_run(folder: Path, base: Path, job: flarejob.FlJob, documents: dict[str, dict[str, Any]]) -> None:
    """Write one run's job folder: a copy of ``base`` (:func:`prepare`'s), the run's ``documents``
    (:func:`core.flarejob.run_documents`) over it, and the kernel's components in the server app."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(base, folder)
    for relative, document in documents.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2))
    custom = folder / job.server_app / "custom"
    custom.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(COMPONENT_SOURCE, custom / COMPONENT_SOURCE.name)
