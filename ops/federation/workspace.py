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

import io
import json
import tempfile
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from botocore.exceptions import ClientError

from core import flare, flarejob
from core.files import TenantTree, UnsafeFile
from core.objects import bucket_for, provision
from ops.federation.server import FederationError

MAX_MODEL_BYTES = 64 << 30
"""The largest global model a federation uploads (64 GiB)."""
MAX_SUMMARY_BYTES = 1 << 20
"""The largest round summary (its metrics) a federation reads."""


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


def fetch_beneath(s3: Any, bucket: str, key: str, folder: Path, relpath: str, what: str) -> Path:
    """Download one object to ``relpath`` of ``folder``, a folder the FL server's sandbox writes:
    the file is created beneath the folder's fd, never through a link (:class:`core.files.TenantTree`);
    its path.

    Raises:
        FederationError: it is missing, or a link (or something else) stands where it goes.
    """
    try:
        with TenantTree.open(folder) as tree:
            parent, _, _ = relpath.rpartition("/")
            if parent:
                tree.makedirs(parent)
            with tree.open_write(relpath) as sink:
                _download(s3, bucket, key, sink, MAX_MODEL_BYTES, what)
    except UnsafeFile as exc:
        raise FederationError(f"cannot write {what} into the federation: {exc.message}") from None
    return folder / relpath


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


def upload_round(s3: Any, tenant: str, root: str, round_number: int, npz: BinaryIO, summary: BinaryIO) -> str:
    """Upload one round's global model and metrics, from files the caller opened (beneath the
    federation's directory: :class:`core.files.TenantTree`); the model's key."""
    bucket = bucket_for(tenant)
    key = checkpoint_key(root, round_number)
    s3.upload_fileobj(npz, bucket, key)
    s3.upload_fileobj(summary, bucket, metrics_key(root, round_number))
    return key


def upload_final(s3: Any, tenant: str, root: str, last: int, framework: str) -> list[str]:
    """Upload the final model (round ``last``'s, ``.npz``, and ``.pt`` for a pytorch job) and every
    round's metrics; the keys written. Everything is read from the workspace, where each round was
    uploaded as it was reported, through anonymous temporary files of the kernel's own: nothing is
    read from, or written to, the federation's directory (tenant code writes it).

    Raises:
        FederationError: a round's model or metrics are missing from the workspace, or the model is
            not a plain ``.npz`` of at most :data:`MAX_MODEL_BYTES` (decompressed).
    """
    if last < 1:
        raise FederationError("no round finished: there is no final model")
    bucket = bucket_for(tenant)
    outputs = [f"{root}model_out/model.npz"]
    with tempfile.TemporaryFile() as npz, tempfile.TemporaryFile() as pt:
        _download(s3, bucket, checkpoint_key(root, last), npz, MAX_MODEL_BYTES, "the last global model")
        if framework == "pytorch":  # before the upload: boto3 closes what it uploads
            npz.seek(0)
            _npz_to_state_dict(npz, pt)
            pt.seek(0)
            outputs.append(f"{root}model_out/model.pt")
            s3.upload_fileobj(pt, bucket, outputs[-1])
        npz.seek(0)
        s3.upload_fileobj(npz, bucket, outputs[0])
    rounds = []
    for number in range(1, last + 1):
        body = io.BytesIO()
        _download(s3, bucket, metrics_key(root, number), body, MAX_SUMMARY_BYTES, "a round's metrics")
        try:
            rounds.append(json.loads(body.getvalue()))
        except ValueError:
            raise FederationError(f"round {number}'s metrics are not JSON") from None
    outputs.append(f"{root}files_out/metrics.json")
    s3.put_object(Bucket=bucket, Key=outputs[-1], Body=json.dumps({"rounds": rounds}, indent=2).encode())
    return outputs


def _download(s3: Any, bucket: str, key: str, sink: BinaryIO, max_bytes: int, what: str) -> None:
    """Download one object of at most ``max_bytes`` into ``sink``.

    Raises:
        FederationError: it is missing or larger.
    """
    try:
        size = int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
        if size > max_bytes:
            raise FederationError(f"{what} {key} holds {size} bytes, more than {max_bytes}")
        s3.download_fileobj(bucket, key, sink)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        raise FederationError(f"cannot read {what} {key}: {code}") from None


def _npz_to_state_dict(npz: BinaryIO, dest: BinaryIO) -> None:
    """Write the arrays of ``npz`` as a torch state dict; no pickles, and at most
    :data:`MAX_MODEL_BYTES` once decompressed (a small ZIP may inflate to anything)."""
    import numpy as np
    import torch

    try:
        with np.load(npz, allow_pickle=False) as archive:
            inflated = sum(info.file_size for info in archive.zip.infolist())
            if inflated > MAX_MODEL_BYTES:
                raise FederationError(
                    f"the final model inflates to {inflated} bytes, more than {MAX_MODEL_BYTES}"
                )
            torch.save({name: torch.from_numpy(archive[name]) for name in archive.files}, dest)
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise FederationError(f"the final model is not a plain .npz: {exc}") from None
