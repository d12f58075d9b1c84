"""The distributed-training trials of :mod:`ops.bench.training`: a two-node FSDP2 job
(``examples/fsdp-lm``, gloo on CPU) on the training benchmark's platform.

* ``gang_restart_s``: the host of one rank (its agent, and with it the rank) is SIGKILLed once the
  job's first whole sharded checkpoint is stored; the figure runs from the kill to the store time of
  the first ``job.progress`` of the restarted gang (its first training step after the resume: the
  example reports it at once). It spans the loss's detection (three heartbeat intervals), the
  revocation of the whole gang, its placement on whichever workers are alive, every node's fetch of
  the inputs and of every part of the checkpoint, torch's start on two cores, and the rendezvous.
  ``gang_detect_s``: the kill to ``worker.lost``; ``gang_started_s``: to the last node's
  ``job.started`` of the restarted gang (the agents have fetched the inputs and every part and
  started torchrun; the rest is torch's start, the rendezvous, the load and the first step).
* ``gang_recovery_s``: the same with the survivors keeping their processes (an elastic gang): not
  built yet, so the figure is ``None``.
* ``checkpoint_stall_s``: the longest a save held training up, as the example measures it on rank 0
  (``checkpoint_stall_s`` in its progress metrics): sharded, every rank staging its own shards for
  ``torch.distributed.checkpoint.async_save``. The baseline, same run: the same job saving one full
  file (the state gathered to rank 0, then ``torch.save``), ``checkpoint_stall_full_s``.
"""

from __future__ import annotations

import importlib.util
import io
import time
from typing import Any

import numpy as np

from core.log import EventLog
from core.objects import bucket_for, provision
from core.streams import job_subject
from schemas.jobs import JobResources, JobSubmitted

TENANT = "bench"
SCRIPT = "scripts/fsdp-lm/train.py"
TOKENS = "jobs/fsdp-lm/tokens.npz"
SEQUENCES = 256


def upload(s3: Any, example: Any) -> None:
    """The example's script and a corpus of :data:`SEQUENCES` walks, into the bench tenant's bucket."""
    spec = importlib.util.spec_from_file_location("fsdp_lm_make_data", example / "make_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = io.BytesIO()
    np.savez(data, tokens=module.synthetic(SEQUENCES))
    bucket = bucket_for(TENANT)
    provision(s3, bucket)
    s3.put_object(Bucket=bucket, Key=TOKENS, Body=data.getvalue())
    s3.put_object(Bucket=bucket, Key=SCRIPT, Body=(example / "train.py").read_bytes())


async def submit(log: EventLog, name: str, epochs: int, form: str) -> None:
    args = ["--data", TOKENS, "--epochs", str(epochs), "--checkpoint-every", "1"]
    args += ["--checkpoint-format", form, "--min-epoch-seconds", "1"]
    event = JobSubmitted(
        name=name,
        kind="ddp",
        strategy="fsdp",
        shards=2,
        command=[SCRIPT, *args],
        inputs=[SCRIPT, TOKENS],
        resources=JobResources(cpus=1.0),
    )
    await log.append(job_subject(TENANT, name, event), event, event_id=f"bench-{name}")


def stalls(found: list[Any]) -> list[float]:
    """Every save's stall the job reported."""
    return [
        r.event.metrics["checkpoint_stall_s"]
        for r in found
        if r.subject.endswith(".progress") and "checkpoint_stall_s" in r.event.metrics
    ]


async def restart_trial(log: EventLog, platform: Any, name: str, spare: int, until: Any) -> dict[str, float]:
    """Kill slot 1's host once the first whole sharded checkpoint is stored; time the restart."""
    await submit(log, name, epochs=4, form="sharded")
    found = await until(log, name, lambda rs: any(_whole(r) for r in rs))
    placed = next(r.event for r in found if r.subject.endswith(".placed"))
    victim_id = next(a.worker_id for a in placed.assignments if a.slot == 1)
    victim = platform.agent_of(victim_id)
    killed = time.time()
    victim.kill()
    platform.add_agent(f"agent-gang-spare-{spare}")
    found = await until(log, name, lambda rs: any(r.subject.endswith(".completed") for r in rs))
    last = max(a.epoch for r in found if r.subject.endswith(".placed") for a in r.event.assignments)
    resumed = [r for r in found if r.subject.endswith(".progress") and r.event.epoch == last]
    started = [r for r in found if r.subject.endswith(".started") and r.event.epoch == last]
    lost = [r.time_ns / 1e9 async for r in log.replay("WORKERS", subjects=f"worker.{victim_id}.lost")]
    return {
        "gang_restart_s": resumed[0].time_ns / 1e9 - killed,
        "gang_detect_s": lost[0] - killed,
        "gang_started_s": max(r.time_ns for r in started) / 1e9 - killed,
        "checkpoint_stall_s": max(stalls(found)),
    }


async def full_save_trial(log: EventLog, name: str, until: Any) -> dict[str, float]:
    """The same job saving one full file a checkpoint, uninterrupted: the stall's baseline."""
    await submit(log, name, epochs=3, form="full")
    found = await until(log, name, lambda rs: any(r.subject.endswith(".completed") for r in rs))
    return {"checkpoint_stall_full_s": max(stalls(found))}


def _whole(record: Any) -> bool:
    return record.subject.endswith(".checkpointed") and bool(record.event.parts)
