"""DDP and FSDP jobs end to end: real agents, a real coordinator, real torchrun (gloo on CPU), the real
object store, and the examples' training scripts (``examples/ddp-mlp/train.py``,
``examples/fsdp-lm/train.py``).

Each test uses a tenant (so a bucket) of its own, the session's servers and free ports only (the
master port is hashed from the job id), so the tests run in parallel with the rest of the suite.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from deepspeed.utils import zero_to_fp32
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from agent.checkpoint_parts import Manifest, unpack
from agent.runtimes.process import kill_marked
from core.files import TenantTree
from core.log import EventLog
from core.streams import job_subject
from ops.devstack.objectstore import ObjectStoreServer
from ops.ports import free_port
from schemas.envelope import Recorded
from schemas.jobs import (
    JobAssignmentRevoked,
    JobCheckpointed,
    JobCheckpointPartStored,
    JobCompleted,
    JobFailed,
    JobPlaced,
    JobProgress,
    JobResources,
    JobShardCompleted,
    JobSubmitted,
)
from schemas.workers import WorkerLost
from tests.support import REPO, AgentProcess, coordinator, of, records, registered

EXAMPLE = REPO / "examples" / "ddp-mlp"
SCRIPT = "scripts/ddp-mlp/train.py"
DATA = "jobs/mlp/data.npz"
SAMPLES = 512
BATCH = 64
STEPS_PER_EPOCH = SAMPLES // 2 // BATCH  # per rank, two ranks
HEARTBEAT = ("--heartbeat", "2.0")
"""Torch imports peg both cores for seconds: at the suite's 0.2 s an agent starved that long would be
declared lost (after 3 silent intervals) with nothing wrong. At 1 s a loaded machine (a CI run beside
other work) still lost a healthy rank's host now and then, and the gang restarted twice."""
JOB_TIMEOUT_S = 180.0
"""Four torch imports (two per node) take ~15 s of CPU on this 2-core machine; under a loaded
suite, a minute per placement."""


def make_data() -> Any:
    """The example's own dataset generator (``examples/ddp-mlp/make_data.py``)."""
    spec = importlib.util.spec_from_file_location("ddp_mlp_make_data", EXAMPLE / "make_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workspace(object_store: ObjectStoreServer, script: bytes | None = None) -> tuple[str, Any]:
    """A fresh tenant whose bucket holds the training script and the example's dataset."""
    tenant = f"ddp{secrets.token_hex(4)}"
    s3 = object_store.client()
    s3.create_bucket(Bucket=f"rt-{tenant}")
    x, y = make_data().synthetic(SAMPLES)
    data = io.BytesIO()
    np.savez(data, x=x, y=y)
    s3.put_object(Bucket=f"rt-{tenant}", Key=DATA, Body=data.getvalue())
    body = script if script is not None else (EXAMPLE / "train.py").read_bytes()
    s3.put_object(Bucket=f"rt-{tenant}", Key=SCRIPT, Body=body)
    return tenant, s3


async def submit(
    log: EventLog, tenant: str, job_id: str, *args: str, inputs: list[str] | None = None
) -> None:
    event = JobSubmitted(
        name="mlp",
        kind="ddp",
        shards=2,
        command=[SCRIPT, "--data", DATA, "--batch-size", str(BATCH), *args],
        inputs=inputs if inputs is not None else [SCRIPT, DATA],
        resources=JobResources(cpus=1.0),
    )
    await log.append(job_subject(tenant, job_id, event), event, event_id=f"submit-{tenant}-{job_id}")


async def job_until(
    log: EventLog, predicate: Callable[[list[Recorded[Any]]], Any], what: str, timeout: float = JOB_TIMEOUT_S
) -> list[Recorded[Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await records(log, "JOBS")
        if predicate(found):
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; JOBS holds {[r.event for r in found]}")


def ended(found: list[Recorded[Any]]) -> bool:
    return bool(of(found, JobCompleted) or [e for e in of(found, JobFailed) if e.slot is None])


def load_checkpoint(s3: Any, tenant: str, key: str) -> dict[str, Any]:
    body = s3.get_object(Bucket=f"rt-{tenant}", Key=key)["Body"].read()
    state: dict[str, Any] = torch.load(io.BytesIO(body), weights_only=True)
    return state


async def test_a_two_node_ddp_job_trains_checkpoints_to_the_workspace_and_completes(
    log: EventLog, agents: Callable[..., AgentProcess], object_store: ObjectStoreServer
) -> None:
    tenant, s3 = workspace(object_store)
    workers = {
        await registered(log, agents("n1", *HEARTBEAT)),
        await registered(log, agents("n2", *HEARTBEAT)),
    }
    async with coordinator(log):
        await submit(log, tenant, "mlp-1", "--epochs", "4", "--checkpoint-every", "2")
        jobs = await job_until(log, ended, "the job ended")
    assert of(jobs, JobCompleted), [e for e in of(jobs, JobFailed)]
    [placed] = of(jobs, JobPlaced)
    assert {a.worker_id for a in placed.assignments} == workers  # one node per worker
    assert len(of(jobs, JobShardCompleted)) == 2

    progress = [e for e in of(jobs, JobProgress) if e.train_epoch is not None]
    # at most one report a second per assignment: epochs that end within one second are merged
    epochs = [p.train_epoch for p in progress]
    assert epochs == sorted(set(epochs)) and epochs[0] >= 1 and epochs[-1] == 4
    assert all(p.step == STEPS_PER_EPOCH * p.train_epoch for p in progress)
    assert all(p.metrics["world_size"] == 2.0 and p.slot == 0 for p in progress)
    assert progress[-1].loss is not None and progress[0].loss is not None
    assert progress[-1].loss < progress[0].loss

    checkpoints = of(jobs, JobCheckpointed)
    prefix = "jobs/mlp/checkpoints/mlp-1/"
    assert [(c.object_key, c.step) for c in checkpoints] == [
        (f"{prefix}e1-0.ckpt", 2 * STEPS_PER_EPOCH),
        (f"{prefix}e1-1.ckpt", 4 * STEPS_PER_EPOCH),
    ]
    final = load_checkpoint(s3, tenant, checkpoints[-1].object_key)
    assert (final["epoch"], final["step"]) == (4, 4 * STEPS_PER_EPOCH)


async def test_a_lost_worker_restarts_the_gang_from_the_last_checkpoint_not_from_step_0(
    log: EventLog, agents: Callable[..., AgentProcess], object_store: ObjectStoreServer
) -> None:
    tenant, s3 = workspace(object_store)
    nodes = {
        await registered(log, agent): agent
        for agent in (agents("k1", *HEARTBEAT), agents("k2", *HEARTBEAT), agents("k3", *HEARTBEAT))
    }
    async with coordinator(log):
        await submit(
            log, tenant, "mlp-2", "--epochs", "12", "--checkpoint-every", "2", "--min-epoch-seconds", "0.5"
        )
        jobs = await job_until(log, lambda rs: of(rs, JobCheckpointed), "the first complete set")
        [placed] = of(jobs, JobPlaced)
        victim = next(a for a in placed.assignments if a.slot == 0)  # the master's host dies
        killed_at = time.monotonic()
        nodes[victim.worker_id].kill()
        kill_marked(nodes[victim.worker_id].work_dir / victim.assignment_id)  # the host goes down
        jobs = await job_until(log, lambda rs: len(of(rs, JobPlaced)) > 1, "the gang placed again")
        replaced_in = time.monotonic() - killed_at
        jobs = await job_until(log, ended, "the job ended")
    assert of(jobs, JobCompleted), [e for e in of(jobs, JobFailed)]
    assert of(await records(log, "WORKERS"), WorkerLost)

    revoked = of(jobs, JobAssignmentRevoked)
    assert sorted((r.slot, r.epoch) for r in revoked) == [(0, 1), (1, 1)]  # the whole gang
    assert {r.reason for r in revoked if r.slot == 0} == {"worker lost"}
    again = of(jobs, JobPlaced)[1]
    assert sorted(a.slot for a in again.assignments) == [0, 1]
    assert {a.epoch for a in again.assignments} == {2}
    assert victim.worker_id not in {a.worker_id for a in again.assignments}

    resumed_from = [c for c in of(jobs, JobCheckpointed) if c.epoch == 1][-1]
    assert resumed_from.step is not None and resumed_from.step > 0
    second = [e for e in of(jobs, JobProgress) if e.epoch == 2 and e.train_epoch is not None]
    first_epoch_after = resumed_from.step // STEPS_PER_EPOCH + 1
    assert second[0].train_epoch == first_epoch_after > 1, "it restarted from epoch 1"
    assert second[0].step == resumed_from.step + STEPS_PER_EPOCH, "it restarted from step 0"
    assert second[-1].train_epoch == 12
    final = of(jobs, JobCheckpointed)[-1]
    assert final.epoch == 2 and final.object_key.startswith("jobs/mlp/checkpoints/mlp-2/e2-")
    assert load_checkpoint(s3, tenant, final.object_key)["epoch"] == 12
    print(f"gang placed again {replaced_in:.1f}s after the kill; resumed at epoch {first_epoch_after}")


BOOM = b"""
import os
import torch.distributed as dist

dist.init_process_group(os.environ["RESONTECH_DDP_BACKEND"])
print('RESONTECH_PROGRESS {"step": 1}', flush=True)
dist.barrier()
raise ValueError(f"boom in the training code on rank {dist.get_rank()}")
"""


async def test_training_code_that_raises_fails_the_job_with_its_traceback(
    log: EventLog, agents: Callable[..., AgentProcess], object_store: ObjectStoreServer
) -> None:
    tenant, _ = workspace(object_store, script=BOOM)
    await registered(log, agents("b1", *HEARTBEAT))
    await registered(log, agents("b2", *HEARTBEAT))
    async with coordinator(log):
        await submit(log, tenant, "boom")
        jobs = await job_until(log, ended, "the job failed")
    [failed] = [e for e in of(jobs, JobFailed) if e.slot is None]
    assert failed.reason.startswith("shard ") and "exit status 1" in failed.reason
    assert "ValueError: boom in the training code on rank" in failed.log_tail
    assert not of(jobs, JobCompleted) and len(of(jobs, JobPlaced)) == 1  # failed, not restarted


async def test_an_input_gone_from_the_workspace_fails_the_job_naming_it(
    log: EventLog, agents: Callable[..., AgentProcess], object_store: ObjectStoreServer
) -> None:
    tenant, s3 = workspace(object_store)
    await registered(log, agents("g1", *HEARTBEAT))
    await registered(log, agents("g2", *HEARTBEAT))
    s3.delete_object(Bucket=f"rt-{tenant}", Key=DATA)  # deleted after the gateway checked it
    async with coordinator(log):
        await submit(log, tenant, "gone")
        jobs = await job_until(log, ended, "the job failed", timeout=60)
    [failed] = [e for e in of(jobs, JobFailed) if e.slot is None]
    assert f"input {DATA}: the object store answered 404" in failed.reason


# -- strategy: fsdp (examples/fsdp-lm) -----------------------------------------------------------

FSDP_EXAMPLE = REPO / "examples" / "fsdp-lm"
FSDP_SCRIPT = "scripts/fsdp-lm/train.py"
TOKENS = "jobs/lm/tokens.npz"
FSDP_ARGS = ("--data", TOKENS, "--epochs", "6", "--checkpoint-every", "2", "--batch-size", "32")
FSDP_STEPS_PER_EPOCH = 256 // 2 // 32  # 256 sequences, two ranks


def fsdp_workspace_files(root: Path) -> bytes:
    """The example's corpus, written under ``root`` at its key; its bytes."""
    spec = importlib.util.spec_from_file_location("fsdp_lm_make_data", FSDP_EXAMPLE / "make_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = io.BytesIO()
    np.savez(data, tokens=module.synthetic(256))
    (root / TOKENS).parent.mkdir(parents=True, exist_ok=True)
    (root / TOKENS).write_bytes(data.getvalue())
    return data.getvalue()


def fsdp_workspace(object_store: ObjectStoreServer, root: Path) -> tuple[str, Any]:
    """A fresh tenant whose bucket holds the FSDP example and its corpus (also written under ``root``)."""
    data = fsdp_workspace_files(root)
    tenant = f"lm{secrets.token_hex(4)}"
    s3 = object_store.client()
    s3.create_bucket(Bucket=f"rt-{tenant}")
    s3.put_object(Bucket=f"rt-{tenant}", Key=TOKENS, Body=data)
    s3.put_object(Bucket=f"rt-{tenant}", Key=FSDP_SCRIPT, Body=(FSDP_EXAMPLE / "train.py").read_bytes())
    return tenant, s3


def uninterrupted(root: Path) -> dict[str, Any]:
    """The same training, same seed and world size, run straight through by torchrun on this host
    (its checkpoint as one full file): the reference the platform's interrupted run must end equal to."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    argv += ["--master-port", str(free_port()), str(FSDP_EXAMPLE / "train.py"), *FSDP_ARGS]
    argv += ["--checkpoint-format", "full"]
    env = {**os.environ, "RESONTECH_CHECKPOINT_DIR": str(root / "reference"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    state: dict[str, Any] = torch.load(root / "reference" / "epoch-0006.pt", weights_only=True)
    return state


def unpack_set(s3: Any, tenant: str, checkpoint: JobCheckpointed, folder: Path) -> None:
    """Every node's part of a stored set, fetched and unpacked into ``folder`` as an agent does."""
    folder.mkdir(parents=True)
    with TenantTree.open(folder) as tree:
        for slot, key in enumerate(checkpoint.parts):
            archive = folder.parent / f"part-{slot}.tar"
            archive.write_bytes(s3.get_object(Bucket=f"rt-{tenant}", Key=key)["Body"].read())
            unpack(archive, tree, set(), Manifest(step=checkpoint.step or 0, slot=slot))


def load_sharded(s3: Any, tenant: str, checkpoint: JobCheckpointed, root: Path) -> dict[str, Any]:
    """A sharded checkpoint's set, every node's part unpacked into one folder, as one full state (DCP
    reads it without a process group here: a world of one)."""
    folder = root / "final"
    unpack_set(s3, tenant, checkpoint, folder)
    dcp_to_torch_save(folder, root / "final.pt")
    state: dict[str, Any] = torch.load(root / "final.pt", weights_only=True)
    return state


async def interrupted(
    log: EventLog, agents: Callable[..., AgentProcess], tenant: str, strategy: str, *args: str
) -> list[Any]:
    """A two-node ``strategy`` job of the FSDP example on three real agents: the host of node 1 is
    SIGKILLed once the first whole sharded checkpoint is stored; the job's events once it ended,
    checked for what every strategy promises (one restart, from the set, no step skipped or done
    twice, every set the kernel's and whole)."""
    nodes = {
        await registered(log, agent): agent
        for agent in (agents("f1", *HEARTBEAT), agents("f2", *HEARTBEAT), agents("f3", *HEARTBEAT))
    }
    event = JobSubmitted(
        name="lm",
        kind="ddp",
        strategy=strategy,
        shards=2,
        command=[FSDP_SCRIPT, *FSDP_ARGS, *args, "--min-epoch-seconds", "0.5"],
        inputs=[FSDP_SCRIPT, TOKENS],
        resources=JobResources(cpus=1.0, memory_mb=4096),  # DeepSpeed's imports outgrow the 1 GiB default
    )
    await log.append(job_subject(tenant, "lm-1", event), event)
    async with coordinator(log):
        jobs = await job_until(log, lambda rs: of(rs, JobCheckpointed), "the first complete set")
        [placed] = of(jobs, JobPlaced)
        victim = next(a for a in placed.assignments if a.slot == 1)
        nodes[victim.worker_id].kill()
        kill_marked(nodes[victim.worker_id].work_dir / victim.assignment_id)
        jobs = await job_until(log, ended, "the job ended")
    assert of(jobs, JobCompleted), [e for e in of(jobs, JobFailed)]
    assert len(of(jobs, JobPlaced)) == 2  # restarted once, from the checkpoint
    resumed = [e for e in of(jobs, JobProgress) if e.epoch == 2 and e.train_epoch is not None]
    assert resumed[0].train_epoch > 1 and resumed[-1].train_epoch == 6
    assert all(p.step == FSDP_STEPS_PER_EPOCH * p.train_epoch for p in of(jobs, JobProgress) if p.train_epoch)
    assert all(p.metrics["world_size"] == 2.0 for p in resumed)
    sets = of(jobs, JobCheckpointed)
    assert all(c.assignment_id == "" and len(c.parts) == 2 for c in sets)  # the kernel's, each whole
    stored = of(jobs, JobCheckpointPartStored)
    assert {(p.step, p.slot) for p in stored} >= {(c.step, slot) for c in sets for slot in (0, 1)}
    return jobs


def worst_difference(final: dict[str, Any], reference: dict[str, Any]) -> float:
    assert final.keys() == reference.keys()
    return max((final[k].float() - reference[k].float()).abs().max().item() for k in reference)


async def test_an_fsdp_job_survives_a_lost_node_and_ends_equal_to_an_uninterrupted_run(
    log: EventLog, agents: Callable[..., AgentProcess], object_store: ObjectStoreServer, tmp_path: Path
) -> None:
    """``strategy: fsdp``: FSDP2 over two nodes (gloo, CPU), each rank saving its own shards
    (``torch.distributed.checkpoint``), each node's agent uploading its part; the host of one rank
    dies after the first complete set, the gang restarts from it on a replacement (every node fetches
    every part), and the final parameters equal those of a run that was never interrupted (no step
    skipped or done twice: the step counter comes from the checkpoint)."""
    tenant, s3 = fsdp_workspace(object_store, tmp_path)
    jobs = await interrupted(log, agents, tenant, "fsdp")
    reference = await asyncio.to_thread(uninterrupted, tmp_path)
    final = load_sharded(s3, tenant, of(jobs, JobCheckpointed)[-1], tmp_path)
    assert (
        tuple(final["progress"].tolist())
        == (6, 6 * FSDP_STEPS_PER_EPOCH)
        == (reference["epoch"], reference["step"])
    )
    worst = worst_difference(final["model"], reference["model"])
    assert worst <= 1e-5, f"parameters differ by {worst} from the uninterrupted run"


@pytest.mark.parametrize("stage", [2, 3])
async def test_a_deepspeed_zero_job_survives_a_lost_node_and_ends_equal_to_an_uninterrupted_run(
    log: EventLog,
    agents: Callable[..., AgentProcess],
    object_store: ObjectStoreServer,
    tmp_path: Path,
    stage: int,
) -> None:
    """``strategy: deepspeed``: the same model under a DeepSpeed engine, ZeRO-2 and ZeRO-3 over two
    nodes (DeepSpeed's CPU accelerator, gloo), each rank writing DeepSpeed's checkpoint files on its
    node, each node's agent uploading its part; one host dies after the first whole set, the gang
    restarts from it, and the final fp32 parameters (``zero_to_fp32`` over the stored set) equal those
    of an uninterrupted run."""
    tenant, s3 = fsdp_workspace(object_store, tmp_path)
    jobs = await interrupted(log, agents, tenant, "deepspeed", "--zero-stage", str(stage))
    last = of(jobs, JobCheckpointed)[-1]
    assert last.step == 6 * FSDP_STEPS_PER_EPOCH
    tag = f"step-{last.step:08d}"
    unpack_set(s3, tenant, last, tmp_path / "final" / tag)
    args = (*FSDP_ARGS[2:], "--zero-stage", str(stage))
    await asyncio.to_thread(run_example, tmp_path, 2, *args, out="reference", strategy="deepspeed")
    final = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "final"), tag=tag)
    reference = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "reference"), tag=tag)
    worst = worst_difference(final, reference)
    assert worst <= 1e-5, f"parameters differ by {worst} from the uninterrupted run"


def run_example(
    root: Path, ranks: int, *args: str, resume: Path | None = None, out: str, strategy: str = "fsdp"
) -> str:
    """The FSDP example under torchrun on this host, ``ranks`` ranks, checkpoints into ``root/out``."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    argv += ["--master-port", str(free_port()), str(FSDP_EXAMPLE / "train.py"), "--data", TOKENS, *args]
    env = {**os.environ, "RESONTECH_CHECKPOINT_DIR": str(root / out), "OMP_NUM_THREADS": "1"}
    env["RESONTECH_STRATEGY"] = strategy
    if resume is not None:
        env["RESONTECH_RESUME_PATH"] = str(resume)
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_sharded_checkpoint_of_two_ranks_resumes_on_one_as_its_full_state_would(tmp_path: Path) -> None:
    """DCP reshards on load: the checkpoint two ranks saved (each its own shards) resumes on one
    rank, and that run ends where a run resumed from the same state gathered into one full file
    ends."""
    fsdp_workspace_files(tmp_path)
    saved = run_example(tmp_path, 2, "--epochs", "2", "--checkpoint-every", "2", out="two")
    assert 'RESONTECH_CHECKPOINT {"dir": "step-00000008", "step": 8}' in saved
    sharded = tmp_path / "two" / "step-00000008"
    assert sorted(p.name for p in sharded.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    dcp_to_torch_save(sharded, tmp_path / "gathered.pt")
    gathered = torch.load(tmp_path / "gathered.pt", weights_only=True)
    epoch, step = gathered.pop("progress").tolist()
    torch.save({**gathered, "epoch": epoch, "step": step}, tmp_path / "full.pt")
    args = ("--epochs", "3", "--checkpoint-format", "full")
    from_shards = run_example(tmp_path, 1, *args, resume=sharded, out="from-shards")
    run_example(tmp_path, 1, *args, resume=tmp_path / "full.pt", out="from-full")
    assert "epoch 2, step 8, world size 1" in from_shards
    one = torch.load(tmp_path / "from-shards" / "epoch-0003.pt", weights_only=True)
    other = torch.load(tmp_path / "from-full" / "epoch-0003.pt", weights_only=True)
    assert one["step"] == other["step"] == 8 + 256 // 32
    worst = max((one["model"][k] - other["model"][k]).abs().max().item() for k in other["model"])
    assert worst <= 1e-6, f"resumed from shards, the parameters differ by {worst}"
