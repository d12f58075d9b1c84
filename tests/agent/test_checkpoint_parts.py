"""Sharded checkpoints at the agent: each node's part goes up as one archive through its own presigned
URLs, and a restart unpacks every node's part into one folder; what tenant code wrote (the folder)
and what the tenant's workspace holds (the archives) are read as a stranger's."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent import checkpoint_parts
from agent.checkpoint_parts import MANIFEST, Manifest, fetch_set, open_part, stream
from agent.checkpoints import CheckpointUploads
from agent.protocol import CheckpointLine, ProtocolError, parse_line
from agent.runtimes import StartFailed
from core.files import TenantTree, UnsafeFile
from core.settings import Settings
from ops.coordinator.inputs import Presigner
from ops.coordinator.workspecs import ddp_spec
from ops.devstack.objectstore import ObjectStoreServer
from projections.checkpoints import part_keys
from projections.schedule import Checkpoint, JobRecord
from schemas.commands import WorkSpec
from schemas.values import Assignment
from tests.support.projection_records import job_record, worker_record

TENANT = "acme"
WORKERS = {w: worker_record(worker_id=w, provider="p", hostname=w, address="10.0.0.5") for w in ("w0", "w1")}


def job(**fields: Any) -> JobRecord:
    return job_record(tenant=TENANT, job_id="j1", kind="ddp", name="lm", shards=2, **fields)


def asg(slot: int, epoch: int) -> Assignment:
    return Assignment(assignment_id=f"j1-s{slot}-e{epoch}", worker_id=f"w{slot}", slot=slot, epoch=epoch)


@pytest.fixture
def bucket(object_store: ObjectStoreServer) -> Iterator[tuple[Any, str]]:
    s3 = object_store.client()
    name = f"rt-{TENANT}"
    s3.create_bucket(Bucket=name)
    yield s3, name
    for item in s3.list_objects_v2(Bucket=name).get("Contents", []):
        s3.delete_object(Bucket=name, Key=item["Key"])
    s3.delete_bucket(Bucket=name)


def save(folder: Path, step: int, slot: int) -> str:
    """What DCP leaves on one node of a two-node world: its rank's shard; node 0 also the metadata."""
    name = f"step-{step:08d}"
    (folder / name).mkdir(parents=True)
    (folder / name / f"__{slot}_0.distcp").write_bytes(os.urandom(700) + f"node {slot} step {step}".encode())
    if slot == 0:
        (folder / name / ".metadata").write_bytes(f"metadata of step {step}".encode())
    return name


def test_a_part_line_names_its_folder_and_step_and_never_its_key() -> None:
    assert parse_line('RESONTECH_CHECKPOINT {"dir": "step-8", "step": 8}') == CheckpointLine(
        dir="step-8", step=8
    )
    for bad in (
        '{"dir": "step-8"}',
        '{"dir": "a", "path": "b", "step": 1}',
        '{"dir": "a", "object_key": "k"}',
    ):
        with pytest.raises(ProtocolError):
            parse_line(f"RESONTECH_CHECKPOINT {bad}")


async def test_every_nodes_part_goes_up_in_turn_and_a_restart_unpacks_the_whole_set(
    tmp_path: Path, bucket: tuple[Any, str], settings: Settings
) -> None:
    presigner = Presigner(settings)
    placed = job(assignments={"0": asg(0, 2), "1": asg(1, 2)}, epoch=2)
    base = WorkSpec(runtime="torchrun", command=["scripts/train.py"])
    uploads, folders = [], []
    for slot in (0, 1):
        spec = ddp_spec(placed, asg(slot, 2), base, presigner, WORKERS)
        assert list(spec.part_urls) == part_keys(placed, 2, slot)  # its own keys, and only its own
        folder = tmp_path / f"node-{slot}" / "checkpoints"
        folder.mkdir(parents=True)
        folders.append(folder)
        uploads.append(
            CheckpointUploads(TenantTree.open(folder), {}, f"a{slot}", part_urls=spec.part_urls, slot=slot)
        )
    reported: dict[int, list[str | None]] = {0: [], 1: []}
    for step in (32, 64, 96, 128):
        for slot in (0, 1):
            line = CheckpointLine(dir=save(folders[slot], step, slot), step=step)
            done = await uploads[slot].resolve(line)
            assert done is not None and done.dir == line.dir and done.step == step
            reported[slot].append(done.object_key)
    prefix = "jobs/lm/checkpoints/j1/"
    assert reported[1] == [f"{prefix}e2-{n}/node-1.tar" for n in (0, 1, 2, 0)]  # in turn, one folder a save
    assert [key.replace("node-0", "node-1") for key in reported[0] if key] == reported[1]
    assert [list(f.iterdir()) for f in folders] == [[], []]  # uploaded, then removed from the disk

    # the set of step 96 (folder e2-2) is whole: a restart on one node gets a GET of each part
    last = Checkpoint(
        object_key=f"{prefix}e2-2/",
        seq=9,
        epoch=2,
        step=96,
        parts=[f"{prefix}e2-2/node-{s}.tar" for s in (0, 1)],
    )
    restarted = job(assignments={"0": asg(0, 3)}, epoch=3, last_checkpoint=last)
    spec = ddp_spec(
        restarted, asg(0, 3), msgspec.structs.replace(base, resume_from=last.object_key), presigner, WORKERS
    )
    assert list(spec.resume_parts) == last.parts and spec.resume_step == 96 and spec.resume_url is None
    resumed = await fetch_set(spec.resume_parts, tmp_path / "restart", 96)
    assert sorted(p.name for p in resumed.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (resumed / "__1_0.distcp").read_bytes().endswith(b"node 1 step 96")
    assert (resumed / ".metadata").read_bytes() == b"metadata of step 96"
    with pytest.raises(StartFailed, match="exists already"):  # never unpacked over what ran there
        await fetch_set(spec.resume_parts, tmp_path / "restart", 96)
    # the set of step 32 (folder e2-0) was overwritten by step 128's: refused, never mixed in
    overwritten = {
        f"{prefix}e2-0/node-{n}.tar": presigner.url("rt-acme", f"{prefix}e2-0/node-{n}.tar") for n in (0, 1)
    }
    with pytest.raises(
        StartFailed, match=r"e2-0/node-0.tar: refused: it holds step 128 of node 0, not step 32"
    ):
        await fetch_set(overwritten, tmp_path / "mixed", 32)


async def test_a_folder_holding_anything_but_plain_files_is_never_uploaded(
    tmp_path: Path, bucket: tuple[Any, str], settings: Settings
) -> None:
    s3, name = bucket
    placed = job(assignments={"0": asg(0, 1), "1": asg(1, 1)}, epoch=1)
    spec = ddp_spec(
        placed, asg(0, 1), WorkSpec(runtime="torchrun", command=["t.py"]), Presigner(settings), WORKERS
    )
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    secret = tmp_path / "agent-credentials"
    secret.write_text("nkey seed")
    uploads = CheckpointUploads(TenantTree.open(folder), {}, "a0", part_urls=spec.part_urls, slot=0)
    (folder / "linked").mkdir()
    (folder / "linked" / "__0_0.distcp").symlink_to(secret)  # a link to the agent's own files
    (folder / "nested").mkdir()
    (folder / "nested" / "inner").mkdir()
    (folder / "fifo").mkdir()
    os.mkfifo(folder / "fifo" / "__0_0.distcp")
    (folder / "hardlinked").mkdir()
    os.link(secret, folder / "hardlinked" / "__0_0.distcp")
    (folder / "odd").mkdir()
    (folder / "odd" / "a b").write_bytes(b"x")
    (folder / "as-link").symlink_to(tmp_path)
    (folder / "empty").mkdir()
    for bad in (
        "linked",
        "nested",
        "fifo",
        "hardlinked",
        "odd",
        "as-link",
        "..",
        "../checkpoints",
        "missing",
    ):
        assert await uploads.resolve(CheckpointLine(dir=bad, step=1)) is None, bad
    assert s3.list_objects_v2(Bucket=name).get("KeyCount", 0) == 0
    assert secret.read_text() == "nkey seed"
    assert (
        await CheckpointUploads(TenantTree.open(folder), {}, "a1").resolve(CheckpointLine(dir="odd", step=1))
        is None
    )


async def test_the_archive_is_exactly_as_long_as_announced(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    save(folder, 7, 0)
    (folder / "step-00000007" / "empty").write_bytes(b"")
    part = open_part(TenantTree.open(folder), "step-00000007", step=7, slot=0)
    data = b"".join([chunk async for chunk in stream(part)])
    part.close()
    assert len(data) == part.size
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames() == [MANIFEST, ".metadata", "__0_0.distcp", "empty"]


def hostile(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], manifest: Manifest | None) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        if manifest is not None:
            content = msgspec.json.encode(manifest)
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        for info, content in members:
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if info.isreg() else None)


def member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    ("members", "manifest", "why"),
    [
        ([(member("../escaped"), b"x")], Manifest(step=5, slot=0), "not a plain file with a plain name"),
        ([(member("/tmp/escaped"), b"x")], Manifest(step=5, slot=0), "not a plain file with a plain name"),
        ([(member("sub/escaped"), b"x")], Manifest(step=5, slot=0), "not a plain file with a plain name"),
        ([(member("l", tarfile.SYMTYPE, "/etc/passwd"), b"")], Manifest(step=5, slot=0), "not a plain file"),
        ([(member("h", tarfile.LNKTYPE, "/etc/passwd"), b"")], Manifest(step=5, slot=0), "not a plain file"),
        ([(member("d", tarfile.DIRTYPE), b"")], Manifest(step=5, slot=0), "not a plain file"),
        ([(member("x" * 120), b"x")], Manifest(step=5, slot=0), "not a plain file with a plain name"),
        ([(member("a"), b"1"), (member("a"), b"2")], Manifest(step=5, slot=0), "comes twice"),
        ([(member("a"), b"1")], None, "it holds no manifest, not step 5 of node 0"),
        ([(member("a"), b"1")], Manifest(step=6, slot=0), "it holds step 6 of node 0, not step 5"),
        ([(member("a"), b"1")], Manifest(step=5, slot=1), "it holds step 5 of node 1, not step 5 of node 0"),
    ],
)
def test_a_hostile_part_is_refused_and_writes_nothing_outside_its_folder(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], manifest: Manifest | None, why: str
) -> None:
    archive = tmp_path / "part.tar"
    hostile(archive, members, manifest)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafeFile, match=why), TenantTree.open(out) as tree:
        checkpoint_parts.unpack(archive, tree, set(), Manifest(step=5, slot=0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "part.tar"]
    assert all(p.is_file() and not p.is_symlink() for p in out.iterdir())
