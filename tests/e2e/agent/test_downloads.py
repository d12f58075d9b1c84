"""A job's inputs: presigned by the kernel (ops/coordinator/inputs.py), fetched by the agent
(agent/downloads.py)
from the real object store into the assignment's working dir, never outside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.downloads import fetch_all, target_of
from agent.runtimes.base import StartFailed
from core.settings import Settings
from ops.coordinator.inputs import InputError, Presigner
from ops.devstack.objectstore import ObjectStoreServer


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_targets_stay_inside_the_working_dir(tmp_path: Path) -> None:
    assert target_of(tmp_path, "jobs/x/shards/0.zip") == tmp_path / "jobs" / "x" / "shards" / "0.zip"
    for bad in ("/etc/passwd", "../escape", "a/../../b", "", "a//b", "./a"):
        with pytest.raises(StartFailed):
            target_of(tmp_path, bad)


async def test_inputs_are_presigned_with_prefixes_expanded_and_fetched(
    object_store: ObjectStoreServer, settings: Settings, tmp_path: Path
) -> None:
    s3 = object_store.client()
    s3.create_bucket(Bucket="rt-inputs")
    s3.put_object(Bucket="rt-inputs", Key="scripts/train.py", Body=b"print(1)\n")
    for i in range(3):
        s3.put_object(Bucket="rt-inputs", Key=f"jobs/m/shards/{i}.zip", Body=bytes([i]) * 1000)
    presigner = Presigner(settings)
    downloads = await presigner.downloads_async("inputs", ["scripts/train.py", "jobs/m/shards/"])
    assert sorted(downloads) == [
        "jobs/m/shards/0.zip",
        "jobs/m/shards/1.zip",
        "jobs/m/shards/2.zip",
        "scripts/train.py",
    ]
    written = await fetch_all(downloads, tmp_path / "work")
    assert (tmp_path / "work" / "scripts" / "train.py").read_text() == "print(1)\n"
    assert (tmp_path / "work" / "jobs" / "m" / "shards" / "2.zip").read_bytes() == b"\x02" * 1000
    assert len(written) == 4 and not list((tmp_path / "work").rglob("*.partial"))
    with pytest.raises(InputError, match="no objects under jobs/none/"):
        presigner.downloads("inputs", ["jobs/none/"])


async def test_a_failed_download_names_the_input(
    object_store: ObjectStoreServer, settings: Settings, tmp_path: Path
) -> None:
    s3 = object_store.client()
    s3.create_bucket(Bucket="rt-gone")
    downloads = Presigner(settings).downloads("gone", ["jobs/m/shards/0.zip"])  # presigning never checks
    with pytest.raises(StartFailed, match=r"input jobs/m/shards/0.zip: the object store answered 404"):
        await fetch_all(downloads, tmp_path)
    assert files_under(tmp_path) == []  # nothing half-written is left behind
