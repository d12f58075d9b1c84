"""What a federation reads from and writes to object storage: the tenant's shards, training code and
initial model, the kernel's kit bucket, and the job's outputs in the tenant's workspace.

Outputs of a job named ``{name}`` go under ``jobs/{name}/`` (or its ``output_prefix``)::

    model_out/model.npz            the final global model (and model.pt for a pytorch job)
    model_out/rounds/round-NNNNN.npz   the global model after each round (the checkpoints)
    files_out/round-NNNNN.json     each round's aggregated metrics
    files_out/metrics.json         every round's metrics, written at the end

A later job of the same name writes over them. Every call blocks (boto3): callers run them in a thread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from core import flare, flarejob
from core.objects import bucket_for, provision
from ops.federation.server import FederationError


def output_root(name: str, output_prefix: str) -> str:
    """The prefix a job's outputs go under."""
    return output_prefix or f"jobs/{name}/"


def checkpoint_key(root: str, round_number: int) -> str:
    return f"{root}model_out/rounds/{flare.round_stem(round_number)}.npz"


def metrics_key(root: str, round_number: int) -> str:
    return f"{root}files_out/{flare.round_stem(round_number)}.json"


def list_keys(s3: Any, bucket: str, prefix: str) -> list[tuple[str, int]]:
    """``(key, size)`` of every object under ``prefix``."""
    found: list[tuple[str, int]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.extend((item["Key"], int(item["Size"])) for item in page.get("Contents", []))
    return found


def resolve_shards(s3: Any, tenant: str, name: str, shards: int) -> list[str]:
    """Each slot's shard ZIP under ``jobs/{name}/shards/`` (:func:`core.flare.shard_keys`); none when
    the folder holds no ZIP (the sites get no data).

    Raises:
        FederationError: some shards, but too few (the message names the slots without one).
    """
    prefix = f"jobs/{name}/shards/"
    try:
        return flare.shard_keys((key for key, _ in list_keys(s3, bucket_for(tenant), prefix)), prefix, shards)
    except flare.ShardsMissing as exc:
        raise FederationError(str(exc)) from None


def fetch_folder(s3: Any, tenant: str, prefix: str, dest: Path, what: str, needs: str = "") -> list[str]:
    """Download every object under ``prefix`` (``""``: the whole workspace) into ``dest``; their paths
    relative to it.

    Raises:
        FederationError: the folder is empty, lacks ``needs`` (a key), or is too large
            (:func:`core.flarejob.code_problem`).
    """
    bucket = bucket_for(tenant)
    objects = list_keys(s3, bucket, prefix)
    if not objects:
        raise FederationError(f"{what} {prefix} is not in the workspace")
    if needs and needs not in {key for key, _ in objects}:
        raise FederationError(f"{what} {needs} is not in the workspace")
    too_big = flarejob.code_problem(objects, f"{what} folder {prefix or '/'}")
    if too_big:
        raise FederationError(f"{too_big}: keep it in a folder of its own")
    names = []
    for key, _ in objects:
        target = dest / key[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
        names.append(key[len(prefix) :])
    return names


def fetch_object(s3: Any, bucket: str, key: str, dest: Path, what: str) -> Path:
    """Download one object; a clear error when it is missing."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        s3.download_file(bucket, key, str(dest))
    except ClientError as exc:
        raise FederationError(
            f"cannot read {what} {key}: {exc.response.get('Error', {}).get('Code')}"
        ) from None
    return dest


def upload_kits(s3: Any, tenant: str, job_id: str, kits: dict[str, Path]) -> list[str]:
    """Upload each site's kit ZIP to the kernel's kit bucket; their keys, in the given order."""
    provision(s3, flare.KIT_BUCKET)
    keys = []
    for site, path in kits.items():
        key = flare.kit_key(tenant, job_id, site)
        s3.upload_file(str(path), flare.KIT_BUCKET, key)
        keys.append(key)
    return keys


def delete_kits(s3: Any, keys: list[str]) -> None:
    """Delete a finished federation's kits: they hold its clients' private keys."""
    for key in keys:
        s3.delete_object(Bucket=flare.KIT_BUCKET, Key=key)


def upload_round(s3: Any, tenant: str, root: str, round_number: int, npz: Path, summary: Path) -> str:
    """Upload one round's global model and metrics; the model's key."""
    bucket = bucket_for(tenant)
    key = checkpoint_key(root, round_number)
    s3.upload_file(str(npz), bucket, key)
    s3.upload_file(str(summary), bucket, metrics_key(root, round_number))
    return key


def upload_final(
    s3: Any, tenant: str, root: str, final_npz: Path, summaries: list[Path], framework: str
) -> list[str]:
    """Upload the final model (``.npz``, and ``.pt`` for a pytorch job) and every round's metrics;
    the keys written."""
    bucket = bucket_for(tenant)
    outputs = [f"{root}model_out/model.npz"]
    s3.upload_file(str(final_npz), bucket, outputs[0])
    if framework == "pytorch":
        pt = final_npz.with_suffix(".pt")
        _npz_to_state_dict(final_npz, pt)
        outputs.append(f"{root}model_out/model.pt")
        s3.upload_file(str(pt), bucket, outputs[-1])
    rounds = [json.loads(path.read_text()) for path in summaries]
    outputs.append(f"{root}files_out/metrics.json")
    s3.put_object(Bucket=bucket, Key=outputs[-1], Body=json.dumps({"rounds": rounds}, indent=2).encode())
    return outputs


def _npz_to_state_dict(npz: Path, dest: Path) -> None:
    import numpy as np
    import torch

    with np.load(npz, allow_pickle=False) as archive:
        torch.save({name: torch.from_numpy(archive[name]) for name in archive.files}, dest)
