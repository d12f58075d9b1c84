"""The parts of DDP jobs one at a time: the rendezvous and gang decisions (pure), the start command
the coordinator builds (presigned against the real object store), the torchrun runtime up to the GPU
boundary (real torchrun, NCCL chosen but not initialised), and checkpoint uploads by presigned URL."""

from __future__ import annotations

import secrets
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from agent.checkpoints import CheckpointUploads
from agent.protocol import CheckpointLine, ProtocolError, parse_line
from agent.runtimes import RUNTIMES, StartFailed, workload_env
from agent.runtimes.torchrun import TorchrunRuntime, before_report, command, port_free
from core.files import TenantTree
from core.rendezvous import PORT_RANGE, master_port, rank_env, rendezvous
from core.sandbox import Sandbox
from core.settings import Settings
from ops.coordinator.inputs import Presigner
from ops.coordinator.workspecs import WorkSpecError, checkpoint_keys, ddp_spec
from ops.devstack.objectstore import ObjectStoreServer
from projections import gangs
from projections.schedule import Checkpoint, JobRecord
from schemas.commands import Rendezvous, StartWork, WorkSpec
from schemas.values import Assignment
from tests.support.projection_records import job_record, worker_record

S = 1_000_000_000
TENANT = f"u{secrets.token_hex(4)}"
"""A tenant (and bucket) of this test process's own: the object store is shared by the session."""


def job(kind: str = "ddp", shards: int = 2, **fields: Any) -> JobRecord:
    return job_record(tenant=TENANT, job_id="j1", name="mlp", kind=kind, shards=shards, **fields)


def asg(slot: int, epoch: int = 1, worker: str | None = None) -> Assignment:
    return Assignment(
        assignment_id=f"j1-{slot}-{epoch}", worker_id=worker or f"w{slot}", slot=slot, epoch=epoch
    )


# -- rendezvous ------------------------------------------------------------------------------------


def test_the_master_port_is_stable_per_placement_and_moves_with_the_epoch() -> None:
    ports = [master_port("acme", "j1", epoch) for epoch in range(1, 21)]
    assert ports == [master_port("acme", "j1", epoch) for epoch in range(1, 21)]
    assert all(port in PORT_RANGE for port in ports)
    assert len(set(ports)) >= 18  # a restart almost always lands elsewhere
    assert master_port("acme", "j1", 1) != master_port("globex", "j1", 1)


def test_cpu_shards_meet_on_gloo_and_gpu_shards_run_a_rank_per_gpu_on_nccl() -> None:
    cpu = rendezvous(tenant="a", job_id="j", epoch=1, master_addr="10.0.0.5", nnodes=3, node_rank=2, gpus=0)
    assert (cpu.master_addr, cpu.nnodes, cpu.node_rank, cpu.nproc_per_node, cpu.backend) == (
        "10.0.0.5",
        3,
        2,
        1,
        "gloo",
    )
    gpu = rendezvous(tenant="a", job_id="j", epoch=1, master_addr="h", nnodes=2, node_rank=0, gpus=4)
    assert (gpu.nproc_per_node, gpu.backend, gpu.master_port) == (4, "nccl", cpu.master_port)


# -- gangs -----------------------------------------------------------------------------------------


def test_a_gang_missing_a_shard_is_broken() -> None:
    whole = job(assignments={"0": asg(0), "1": asg(1)})
    assert not gangs.partial(whole)
    broken = job(assignments={"1": asg(1)}, done={"1": 1})
    assert gangs.partial(broken)  # a finished rank restarts too
    assert not gangs.partial(job(kind="process", assignments={"1": asg(1)}))
    assert not gangs.partial(job())  # nothing held: placed whole
    assert not gangs.partial(job(assignments={"1": asg(1)}, state="failed"))


@pytest.mark.parametrize(
    ("failed", "done", "since_s", "verdict"),
    [
        ({}, {}, 0, None),
        ({"1": False}, {}, 0, "wait"),  # a peer may still turn out lost
        ({"1": False}, {}, 5, "fail"),  # the grace is over and every peer lives
        ({"0": False, "1": False}, {}, 0, "fail"),  # every rank failed: the code, not a peer
        ({"1": False}, {"0": 1}, 0, "fail"),  # the other rank finished
        ({"0": True, "1": False}, {}, 0, "restart"),  # rank 0's agent stopped: rank 1 died of it
    ],
)
def test_the_verdict_on_failed_ranks(
    failed: dict[str, bool], done: dict[str, int], since_s: int, verdict: str | None
) -> None:
    record = job(assignments={"0": asg(0), "1": asg(1)}, failed_slots=failed, done=done)
    assert gangs.verdict(record, failing_since_ns=0, now_ns=since_s * S, grace_ns=4 * S) == verdict


# -- the start command -----------------------------------------------------------------------------


@pytest.fixture
def bucket(object_store: ObjectStoreServer) -> Iterator[tuple[Any, str]]:
    s3 = object_store.client()
    name = f"rt-{TENANT}"
    s3.create_bucket(Bucket=name)
    for key in ("scripts/train.py", "jobs/mlp/shards/a.npz", "jobs/mlp/shards/b.npz", "jobs/mlp/ckpt.pt"):
        s3.put_object(Bucket=name, Key=key, Body=key.encode())
    yield s3, name
    for item in s3.list_objects_v2(Bucket=name).get("Contents", []):
        s3.delete_object(Bucket=name, Key=item["Key"])
    s3.delete_bucket(Bucket=name)


WORKERS = {
    "w0": worker_record(worker_id="w0", provider="p", hostname="host-0", address="10.0.0.5"),
    "w1": worker_record(worker_id="w1", provider="p", hostname="host-1"),
}


def test_each_node_gets_the_rendezvous_and_only_node_0_gets_checkpoint_urls(
    bucket: tuple[Any, str], settings: Settings
) -> None:
    s3, name = bucket
    record = job(
        command=["scripts/train.py", "--epochs", "3"],
        assignments={"0": asg(0, 3), "1": asg(1, 3)},
        epoch=3,
        last_checkpoint=Checkpoint(object_key="jobs/mlp/ckpt.pt", seq=9, epoch=2, step=40),
    )
    presigner = Presigner(settings)
    base = WorkSpec(runtime="torchrun", command=list(record.spec.command), resume_from="jobs/mlp/ckpt.pt")
    first = ddp_spec(record, asg(0, 3), base, presigner, WORKERS)
    second = ddp_spec(record, asg(1, 3), base, presigner, WORKERS)
    assert first.rendezvous == rendezvous(
        tenant=TENANT, job_id="j1", epoch=3, master_addr="10.0.0.5", nnodes=2, node_rank=0, gpus=0
    )
    assert second.rendezvous is not None and second.rendezvous.node_rank == 1
    assert second.rendezvous.master_addr == "10.0.0.5"  # shard 0's worker, for every node
    assert (
        list(first.checkpoint_urls)
        == checkpoint_keys(record, 3)
        == [
            "jobs/mlp/checkpoints/j1/e3-0.ckpt",
            "jobs/mlp/checkpoints/j1/e3-1.ckpt",
        ]
    )
    assert second.checkpoint_urls == {}
    assert first.resume_url is not None and second.resume_url is not None
    assert httpx.get(first.resume_url).content == b"jobs/mlp/ckpt.pt"
    put = httpx.put(first.checkpoint_urls["jobs/mlp/checkpoints/j1/e3-0.ckpt"], content=b"w")
    assert put.status_code == 200
    assert s3.get_object(Bucket=name, Key="jobs/mlp/checkpoints/j1/e3-0.ckpt")["Body"].read() == b"w"
    fresh = ddp_spec(job(assignments={"0": asg(0, 1, "w1")}), asg(0, 1, "w1"), base, presigner, WORKERS)
    assert fresh.rendezvous is not None and fresh.rendezvous.master_addr == "host-1"  # no address: its name
    with pytest.raises(WorkSpecError, match="shard 0 is unknown"):
        ddp_spec(job(assignments={"0": asg(0, 1, "w9")}), asg(0, 1, "w9"), base, presigner, WORKERS)


# -- the torchrun runtime --------------------------------------------------------------------------


def start(spec: WorkSpec, workdir: Path, slot: int = 0) -> tuple[StartWork, dict[str, str]]:
    cmd = StartWork(
        tenant="acme",
        work_id="j1",
        work_kind="job",
        assignment_id=workdir.name,
        slot=slot,
        epoch=1,
        spec=spec,
    )
    return cmd, workload_env(cmd, workdir, gpu_indices=[0, 1] if spec.gpus else [])


def test_the_torchrun_command_of_a_node() -> None:
    rdzv = Rendezvous(master_addr="10.0.0.5", master_port=29611, nnodes=4, node_rank=3, nproc_per_node=2)
    argv = command(rdzv, "/w/data/train.py", ["--lr", "0.1"])
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert " ".join(argv[3:]) == (
        "--nnodes 4 --node-rank 3 --nproc-per-node 2 --master-addr 10.0.0.5 --master-port 29611 "
        "--rdzv-conf timeout=300 --max-restarts 0 /w/data/train.py --lr 0.1"
    )
    env = rank_env(WorkSpec(runtime="torchrun", cpus=8, options={"strategy": "fsdp"}), rdzv)
    assert env == {"RESONTECH_DDP_BACKEND": "gloo", "RESONTECH_STRATEGY": "fsdp", "OMP_NUM_THREADS": "4"}
    assert rank_env(WorkSpec(runtime="torchrun", cpus=0.5), rdzv)["OMP_NUM_THREADS"] == "1"
    assert rank_env(WorkSpec(runtime="torchrun"), rdzv)["RESONTECH_STRATEGY"] == "ddp"  # older commands
    assert RUNTIMES["torchrun"] is TorchrunRuntime


def test_the_log_tail_of_a_failed_node_ends_with_the_ranks_traceback() -> None:
    log = "\n".join(
        ["RESONTECH_PROGRESS {}"] * 50
        + ["[rank0]: Traceback (most recent call last):", "[rank0]: ValueError: boom"]
        + ["E1122 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 9) of binary: python"]
        + ["Traceback (most recent call last):", '  File "run.py"', "ChildFailedError:"] * 20
    )
    tail = before_report(log, 5)
    assert tail.splitlines()[-3:] == [
        "[rank0]: Traceback (most recent call last):",
        "[rank0]: ValueError: boom",
        "E1122 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 9) of binary: python",
    ]
    assert before_report("a\nb\nc", 2) == "b\nc"


async def test_gpu_nodes_run_a_rank_per_gpu_on_nccl_through_real_torchrun(
    tmp_path: Path, bucket: tuple[Any, str]
) -> None:
    """Up to the GPU boundary: torchrun starts both ranks with the GPUs, the backend and the
    checkpoint to resume from; the script prints what it was given instead of initialising NCCL
    (there is no GPU here)."""
    s3, name = bucket
    names = "'LOCAL_RANK', 'WORLD_SIZE', 'RESONTECH_DDP_BACKEND', 'CUDA_VISIBLE_DEVICES', 'OMP_NUM_THREADS'"
    resumed = "open(os.environ['RESONTECH_RESUME_PATH']).read()"
    values = f"' '.join(['RANK', *(os.environ[k] for k in ({names})), {resumed}])"
    workdir = tmp_path / "gpu-node"
    (workdir / "scripts").mkdir(parents=True)  # the agent fetched the inputs here
    (workdir / "scripts" / "show.py").write_text(f"import os, sys; sys.stdout.write({values} + '\\n')")
    spec = WorkSpec(
        runtime="torchrun",
        command=["scripts/show.py"],
        resume_from="jobs/mlp/ckpt.pt",
        resume_url=s3.generate_presigned_url(
            "get_object", Params={"Bucket": name, "Key": "jobs/mlp/ckpt.pt"}
        ),
        gpus=2,
        cpus=8,
        rendezvous=Rendezvous(
            master_addr="127.0.0.1",
            master_port=free_port(),
            nnodes=1,
            node_rank=0,
            nproc_per_node=2,
            backend="nccl",
        ),
    )
    _, env = start(spec, workdir)
    workload = await TorchrunRuntime(Sandbox.for_host()).start(spec, workdir, env)
    lines = [line async for line in workload.lines()]
    assert await workload.wait() == 0, "\n".join(lines)
    ranks = sorted(line.split()[1:] for line in lines if line.startswith("RANK "))
    expected = [[rank, "2", "nccl", "0,1", "4", "jobs/mlp/ckpt.pt"] for rank in ("0", "1")]
    assert ranks == expected, "\n".join(lines)  # one write per line: the ranks share the pipe


async def test_a_node_that_cannot_start_says_why(tmp_path: Path) -> None:
    runtime = TorchrunRuntime(Sandbox.for_host())
    rdzv = Rendezvous(master_addr="127.0.0.1", master_port=free_port(), nnodes=2, node_rank=0)
    cases = [
        (WorkSpec(runtime="torchrun", command=["train.py"]), "needs a command and a rendezvous"),
        (
            WorkSpec(runtime="torchrun", command=["scripts/other.py"], rendezvous=rdzv),
            "'scripts/other.py' is not among",
        ),
        (WorkSpec(runtime="torchrun", command=["../../x.py"], rendezvous=rdzv), "relative path inside"),
    ]
    for n, (spec, reason) in enumerate(cases):
        _, env = start(spec, tmp_path / f"a{n}")
        with pytest.raises(StartFailed, match=reason) as refused:
            await runtime.start(spec, tmp_path / f"a{n}", env)
        assert not refused.value.retryable
    busy_dir = tmp_path / "busy"
    (busy_dir / "scripts").mkdir(parents=True)
    (busy_dir / "scripts" / "train.py").write_text("print(1)")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not port_free(port)
        busy = WorkSpec(
            runtime="torchrun",
            command=["scripts/train.py"],
            rendezvous=msgspec.structs.replace(rdzv, master_port=port),
        )
        _, env = start(busy, busy_dir)
        with pytest.raises(StartFailed, match=f"port {port} is taken") as refused:
            await runtime.start(busy, busy_dir, env)
        assert refused.value.retryable
    assert port_free(port)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# -- checkpoints ------------------------------------------------------------------------------------


def test_a_checkpoint_line_names_a_file_or_an_object_never_both() -> None:
    assert parse_line('RESONTECH_CHECKPOINT {"path": "epoch-2.pt", "step": 8}') == CheckpointLine(
        path="epoch-2.pt", step=8
    )
    for bad in ('{"path": "a", "object_key": "b"}', '{"path": ""}', '{"step": 3}'):
        with pytest.raises(ProtocolError):
            parse_line(f"RESONTECH_CHECKPOINT {bad}")


async def test_checkpoint_files_go_up_by_presigned_url_in_turn_and_leave_the_disk(
    tmp_path: Path, bucket: tuple[Any, str]
) -> None:
    s3, name = bucket
    keys = ["jobs/mlp/checkpoints/j1/e1-0.ckpt", "jobs/mlp/checkpoints/j1/e1-1.ckpt"]
    urls = {k: s3.generate_presigned_url("put_object", Params={"Bucket": name, "Key": k}) for k in keys}
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    uploads = CheckpointUploads(TenantTree.open(folder), urls, "a1")
    reported = []
    for epoch in (2, 4, 6):
        (folder / f"epoch-{epoch}.pt").write_bytes(f"weights {epoch}".encode())
        reported.append(await uploads.resolve(CheckpointLine(path=f"epoch-{epoch}.pt", step=epoch * 10)))
    assert reported == [
        CheckpointLine(object_key=keys[0], step=20),
        CheckpointLine(object_key=keys[1], step=40),
        CheckpointLine(object_key=keys[0], step=60),
    ]
    assert s3.get_object(Bucket=name, Key=keys[0])["Body"].read() == b"weights 6"
    assert s3.get_object(Bucket=name, Key=keys[1])["Body"].read() == b"weights 4"
    assert list(folder.iterdir()) == []
    (tmp_path / "secret").write_text("agent state")
    (folder / "link.pt").symlink_to(tmp_path / "secret")
    for refused in ("../secret", "link.pt", "missing.pt", "/etc/passwd"):
        assert await uploads.resolve(CheckpointLine(path=refused)) is None
    assert (
        await CheckpointUploads(TenantTree.open(folder), {}, "a2").resolve(CheckpointLine(path="x.pt"))
        is None
    )
    written = CheckpointLine(object_key="jobs/mlp/own.pt", step=1)
    assert await uploads.resolve(written) is written
